package quorumlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
)

func waitClosed(t *testing.T, what string, c <-chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s not closed within 10 s", what)
	}
}

// The lock life cycle of issue 2, through a follower replica and a remote
// client alike.
func TestSpecLockLifecycle(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	for _, tc := range specOpeners(t, nodes) {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 20*time.Second)
			o := tc.o
			a, err := o.NewSession(ctx)
			if err != nil {
				t.Fatal(err)
			}
			b, err := o.NewSession(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if a.ID() == 0 || a.ID() == b.ID() {
				t.Fatalf("session IDs %d, %d", a.ID(), b.ID())
			}
			if info, err := o.Holder(ctx, "free"); err != nil || info.Holder != 0 || info.Token != 0 || len(info.Waiters) != 0 {
				t.Fatalf("Holder of a free lock: %+v, %v", info, err)
			}
			la, err := a.TryAcquire(ctx, "res")
			if err != nil {
				t.Fatal(err)
			}
			if la.Name() != "res" || la.Token() == 0 {
				t.Fatalf("lock %q token %d", la.Name(), la.Token())
			}
			if _, err := b.TryAcquire(ctx, "res"); !errors.Is(err, quorumlock.ErrLocked) {
				t.Fatalf("TryAcquire of a held lock: %v, want ErrLocked", err)
			}
			got := make(chan *quorumlock.Lock, 1)
			go func() {
				l, err := b.Acquire(ctx, "res")
				if err != nil {
					t.Error(err)
				}
				got <- l
			}()
			for {
				info, err := o.Holder(ctx, "res")
				if err != nil {
					t.Fatal(err)
				}
				if info.Holder != a.ID() || info.Token != la.Token() || info.Name != "res" {
					t.Fatalf("Holder: %+v", info)
				}
				if len(info.Waiters) == 1 && info.Waiters[0] == b.ID() {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := la.Release(ctx); err != nil {
				t.Fatal(err)
			}
			waitClosed(t, "Lost after Release", la.Lost())
			lb := <-got
			if lb == nil {
				t.FailNow()
			}
			if lb.Token() <= la.Token() {
				t.Fatalf("token %d after %d", lb.Token(), la.Token())
			}
			if err := la.Release(ctx); !errors.Is(err, quorumlock.ErrNotHeld) {
				t.Fatalf("second Release: %v, want ErrNotHeld", err)
			}
			if info, err := o.Holder(ctx, "res"); err != nil || info.Holder != b.ID() || info.Token != lb.Token() {
				t.Fatalf("Holder after hand-off: %+v, %v", info, err)
			}
			// Close releases every lock and ends the session.
			if err := b.Close(ctx); err != nil {
				t.Fatal(err)
			}
			waitClosed(t, "Done after Close", b.Done())
			waitClosed(t, "Lost after Close", lb.Lost())
			if info, err := o.Holder(ctx, "res"); err != nil || info.Holder != 0 {
				t.Fatalf("Holder after Close: %+v, %v", info, err)
			}
			if err := b.Close(ctx); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if _, err := b.TryAcquire(ctx, "other"); !errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Fatalf("TryAcquire on a closed session: %v, want ErrSessionExpired", err)
			}
			if err := lb.Release(ctx); err == nil {
				t.Fatal("Release of a closed session's lock succeeded")
			}
			if closed(a.Done()) {
				t.Fatal("the other session ended")
			}
			a.Close(ctx)
		})
	}
}

// Sessions take the documented default TTL (10 s) from the replica's
// Config and from Dial.
func TestSpecDefaultSessionTTL(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	for _, tc := range specOpeners(t, nodes) {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 10*time.Second)
			s := specSession(ctx, t, tc.o)
			if s.TTL() != 10*time.Second {
				t.Fatalf("default TTL %v, want 10s", s.TTL())
			}
			s2 := specSession(ctx, t, tc.o, quorumlock.WithTTL(3*time.Second))
			if s2.TTL() != 3*time.Second {
				t.Fatalf("WithTTL(3s): TTL %v", s2.TTL())
			}
		})
	}
}

// Leader election through a replica and a remote client: the same API.
func TestSpecElection(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	for _, tc := range specOpeners(t, nodes) {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 20*time.Second)
			o := tc.o
			role := "sched-" + tc.name
			if _, err := o.Leader(ctx, role); !errors.Is(err, quorumlock.ErrNoLeader) {
				t.Fatalf("Leader of an unled role: %v, want ErrNoLeader", err)
			}
			octx, ocancel := context.WithCancel(ctx)
			defer ocancel()
			events := o.Observe(octx, role)
			if ev := nextEvent(t, events); ev.HasLeader() {
				t.Fatalf("first event of an unled role: %+v", ev)
			}
			l1, err := o.Elect(ctx, role, []byte("one"))
			if err != nil {
				t.Fatal(err)
			}
			if l1.Epoch() == 0 {
				t.Fatal("epoch 0")
			}
			info, err := o.Leader(ctx, role)
			if err != nil || info.Epoch != l1.Epoch() || string(info.Value) != "one" || info.Session != l1.Session().ID() {
				t.Fatalf("Leader: %+v, %v (epoch %d)", info, err, l1.Epoch())
			}
			// A lock of the same name is another namespace.
			s, err := o.NewSession(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(ctx)
			if _, err := s.TryAcquire(ctx, role); err != nil {
				t.Fatalf("lock named like a role: %v", err)
			}
			if err := l1.Proclaim(ctx, []byte("uno")); err != nil {
				t.Fatal(err)
			}
			if info, err := o.Leader(ctx, role); err != nil || string(info.Value) != "uno" || info.Epoch != l1.Epoch() {
				t.Fatalf("Leader after Proclaim: %+v, %v", info, err)
			}
			second := make(chan *quorumlock.Leadership, 1)
			go func() {
				l, err := s.Elect(ctx, role, []byte("two"))
				if err != nil {
					t.Error(err)
				}
				second <- l
			}()
			if err := l1.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			waitClosed(t, "Done after Resign", l1.Done())
			if l1.Context().Err() == nil {
				t.Fatal("Context not cancelled after Resign")
			}
			waitClosed(t, "dedicated session after Resign", l1.Session().Done())
			l2 := <-second
			if l2 == nil {
				t.FailNow()
			}
			if l2.Epoch() <= l1.Epoch() {
				t.Fatalf("epoch %d after %d", l2.Epoch(), l1.Epoch())
			}
			if err := l1.Proclaim(ctx, []byte("stale")); !errors.Is(err, quorumlock.ErrNotHeld) && !errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Fatalf("Proclaim after Resign: %v", err)
			}
			// Observe: the first leader, a "no leader" event, the second.
			var seen []quorumlock.LeaderInfo
			for {
				ev := nextEvent(t, events)
				if len(seen) > 0 && ev.Epoch < seen[len(seen)-1].Epoch {
					t.Fatalf("epochs went back: %+v after %+v", ev, seen)
				}
				seen = append(seen, ev)
				if ev.HasLeader() && ev.Epoch == l2.Epoch() {
					break
				}
			}
			gap := false
			for i, ev := range seen {
				if !ev.HasLeader() && i > 0 && seen[i-1].Epoch == l1.Epoch() {
					gap = true
				}
			}
			if !gap {
				t.Fatalf("no \"no leader\" event between the leaders: %+v", seen)
			}
		})
	}
}

// Bad names are refused with ErrInvalidName by every call that takes one,
// on a replica and through a client.
func TestSpecBadNamesEverywhere(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	for _, tc := range specOpeners(t, nodes) {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 20*time.Second)
			s := specSession(ctx, t, tc.o)
			for _, name := range []string{"", strings.Repeat("x", 257), "bad\xffutf8", "nul\x00byte"} {
				if _, err := s.Acquire(ctx, name); !errors.Is(err, quorumlock.ErrInvalidName) {
					t.Errorf("Acquire(%q): %v", name, err)
				}
				if _, err := s.TryAcquire(ctx, name); !errors.Is(err, quorumlock.ErrInvalidName) {
					t.Errorf("TryAcquire(%q): %v", name, err)
				}
				if _, err := tc.o.Holder(ctx, name); !errors.Is(err, quorumlock.ErrInvalidName) {
					t.Errorf("Holder(%q): %v", name, err)
				}
				if _, err := tc.o.Leader(ctx, name); !errors.Is(err, quorumlock.ErrInvalidName) {
					t.Errorf("Leader(%q): %v", name, err)
				}
				if _, err := s.Elect(ctx, name, nil); !errors.Is(err, quorumlock.ErrInvalidName) {
					t.Errorf("Session.Elect(%q): %v", name, err)
				}
				if _, err := tc.o.Elect(ctx, name, nil); !errors.Is(err, quorumlock.ErrInvalidName) {
					t.Errorf("Elect(%q): %v", name, err)
				}
				octx, cancel := context.WithTimeout(ctx, 5*time.Second)
				for range tc.o.Observe(octx, name) {
				}
				if octx.Err() != nil {
					t.Errorf("Observe(%q) did not close at once", name)
				}
				cancel()
			}
			if _, err := s.TryAcquire(ctx, strings.Repeat("y", 256)); err != nil {
				t.Errorf("a 256-byte name: %v", err)
			}
			if _, err := s.TryAcquire(ctx, "ünïcødé/ok"); err != nil {
				t.Errorf("a UTF-8 name: %v", err)
			}
			if closed(s.Done()) {
				t.Error("bad input ended the session")
			}
		})
	}
}

// A client's Observe reports every leader of the role, in epoch order with
// "no leader" between two leaders (issue 4: "a gap-free sequence of
// epochs"), also while the client first learns where the leader is: the
// stream it had opened before must not be dropped and restarted from the
// current state, which skips the leaders elected meanwhile.
func TestSpecClientObserveEveryEpoch(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	// The leader first: the client's stream starts there.
	addrs := []string{nodes[lead].Addr().String()}
	for i, n := range nodes {
		if i != lead {
			addrs = append(addrs, n.Addr().String())
		}
	}
	cl, err := quorumlock.Dial(testCtx(t, 10*time.Second), addrs, quorumlock.WithElectionTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := testCtx(t, 20*time.Second)
	events := cl.Observe(ctx, "sched")
	if ev := nextEvent(t, events); ev.HasLeader() {
		t.Fatalf("first event %+v", ev)
	}
	var epochs []quorumlock.Token
	for i := range 3 {
		ld, err := cl.Elect(ctx, "sched", []byte{byte('a' + i)})
		if err != nil {
			t.Fatal(err)
		}
		epochs = append(epochs, ld.Epoch())
		if err := ld.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range epochs {
		ev := nextEvent(t, events)
		if !ev.HasLeader() || ev.Epoch != want {
			t.Fatalf("event %+v, want the leader of epoch %d (epochs %v)", ev, want, epochs)
		}
		if ev = nextEvent(t, events); ev.HasLeader() {
			t.Fatalf("event %+v after epoch %d, want no leader", ev, want)
		}
	}
}
