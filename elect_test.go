package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// waitCandidate waits until session queues as a candidate for role, read
// through the wire protocol (the public API does not expose candidates).
func waitCandidate(t *testing.T, n *quorumlock.Node, role string, session uint64) {
	t.Helper()
	cli := dialLeader(t, n)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := cli.Holder(testCtx(t, 5*time.Second), &lockpb.HolderRequest{Name: "\x00" + role})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(resp.GetWaiters(), session) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("session %d never became a candidate for %q", session, role)
}

func mustElect(t *testing.T, s *quorumlock.Session, role, value string) *quorumlock.Leadership {
	t.Helper()
	l, err := s.Elect(testCtx(t, 20*time.Second), role, []byte(value))
	if err != nil {
		t.Fatalf("Elect(%q) by session %d: %v", role, s.ID(), err)
	}
	return l
}

// Exactly one leader per epoch, epochs strictly increasing, with candidates
// on every replica campaigning at once.
func TestOneLeaderPerEpoch(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	c.WaitLeader(5 * time.Second)
	var leader atomic.Uint64
	var mu sync.Mutex
	var epochs []quorumlock.Token
	var wg sync.WaitGroup
	for _, id := range c.IDs() {
		for range 2 {
			n := c.Node(id)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 5 {
					ld, err := n.Elect(testCtx(t, 30*time.Second), "sched", []byte("x"))
					if err != nil {
						t.Errorf("Elect: %v", err)
						return
					}
					if !leader.CompareAndSwap(0, ld.Session().ID()) {
						t.Errorf("two leaders: %d and %d", leader.Load(), ld.Session().ID())
					}
					mu.Lock()
					epochs = append(epochs, ld.Epoch())
					mu.Unlock()
					time.Sleep(time.Millisecond)
					leader.Store(0)
					if err := ld.Resign(testCtx(t, 5*time.Second)); err != nil {
						t.Errorf("Resign: %v", err)
					}
					if !closed(ld.Done()) || ld.Context().Err() == nil {
						t.Error("Done/Context not ended by Resign")
					}
				}
			}()
		}
	}
	wg.Wait()
	for i := 1; i < len(epochs); i++ {
		if epochs[i] <= epochs[i-1] {
			t.Fatalf("epochs not strictly increasing: %v", epochs)
		}
	}
	if len(epochs) != 30 {
		t.Fatalf("%d leaderships, want 30", len(epochs))
	}
}

// Epochs grow across resignation, session expiry and replica failover, and
// Leader reports the current one with its value.
func TestEpochsAcrossResignExpiryFailover(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	f1, f2 := follower(c, lead), follower(c, lead, follower(c, lead))
	a := newSession(t, c.Node(f1))
	b := newSession(t, c.Node(f2))
	cc := newSession(t, c.Node(lead))
	ctx := testCtx(t, 30*time.Second)

	la := mustElect(t, a, "sched", "a")
	info, err := c.Node(lead).Leader(ctx, "sched")
	if err != nil || info.Session != a.ID() || info.Epoch != la.Epoch() || string(info.Value) != "a" {
		t.Fatalf("Leader: %+v %v", info, err)
	}
	// The role does not collide with a lock of the same name.
	lk := mustAcquire(t, b, "sched")
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}

	bGot := make(chan *quorumlock.Leadership, 1)
	go func() { l, _ := b.Elect(ctx, "sched", []byte("b")); bGot <- l }()
	waitCandidate(t, c.Node(lead), "sched", b.ID())
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	lb := <-bGot
	if lb == nil || lb.Epoch() <= la.Epoch() {
		t.Fatalf("after resign: %v", lb)
	}

	// b's replica stops: its session expires and cc takes over.
	cGot := make(chan *quorumlock.Leadership, 1)
	go func() { l, _ := cc.Elect(ctx, "sched", []byte("c")); cGot <- l }()
	c.Stop(f2)
	select {
	case <-lb.Done():
	case <-time.After(time.Second):
		t.Fatal("leadership on a stopped replica not reported lost")
	}
	lc := <-cGot
	if lc == nil || lc.Epoch() <= lb.Epoch() {
		t.Fatalf("after expiry: %v", lc)
	}

	// The cluster's leader replica (cc's) stops; a's replica campaigns.
	c.Restart(f2)
	aGot := make(chan *quorumlock.Leadership, 1)
	go func() {
		l, err := a.Elect(ctx, "sched", []byte("a2"))
		if err != nil {
			t.Error(err)
		}
		aGot <- l
	}()
	waitCandidate(t, c.Node(lead), "sched", a.ID())
	c.Stop(lead)
	la2 := <-aGot
	if la2 == nil || la2.Epoch() <= lc.Epoch() {
		t.Fatalf("after failover: %v", la2)
	}
	if _, err := c.Node(f1).Leader(ctx, "nobody"); !errors.Is(err, quorumlock.ErrNoLeader) {
		t.Fatalf("Leader of an empty role: %v", err)
	}
}

// The leader's Context is cancelled before any other candidate is elected
// when the leader's replica is cut off.
func TestLeadershipEndsBeforeNextElected(t *testing.T) {
	t.Parallel()
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	x := follower(c, lead)
	la, err := c.Node(x).Elect(testCtx(t, 10*time.Second), "sched", nil)
	if err != nil {
		t.Fatal(err)
	}
	elected := make(chan time.Time, 1)
	go func() {
		if _, err := c.Node(lead).Elect(testCtx(t, 30*time.Second), "sched", nil); err != nil {
			t.Error(err)
		}
		elected <- time.Now()
	}()
	c.Isolate(x)
	<-la.Context().Done()
	ended := time.Now()
	if at := <-elected; !ended.Before(at) {
		t.Fatalf("next leader elected %v before the old leadership ended", ended.Sub(at))
	}
}

// A candidate that leaves the queue does not promote the one behind it: the
// leader stays leader until it goes, and the candidate that left never
// leads.
func TestWithdrawnCandidateDoesNotPromote(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	n := c.Node(lead)
	a, b, cc := newSession(t, n), newSession(t, c.Node(follower(c, lead))), newSession(t, n)
	la := mustElect(t, a, "sched", "a")
	bctx, bcancel := context.WithCancel(context.Background())
	bErr := make(chan error, 1)
	go func() { _, err := b.Elect(bctx, "sched", nil); bErr <- err }()
	cGot := make(chan *quorumlock.Leadership, 1)
	go func() { l, _ := cc.Elect(testCtx(t, 20*time.Second), "sched", nil); cGot <- l }()
	ctx := testCtx(t, 10*time.Second)
	waitCandidate(t, n, "sched", b.ID())
	waitCandidate(t, n, "sched", cc.ID())
	bcancel()
	if err := <-bErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("withdrawn candidate: %v", err)
	}
	select {
	case l := <-cGot:
		t.Fatalf("candidate behind a withdrawn one elected while the leader leads: %v", l.Epoch())
	case <-time.After(300 * time.Millisecond):
	}
	if info, err := n.Leader(ctx, "sched"); err != nil || info.Session != a.ID() {
		t.Fatalf("leader changed: %+v %v", info, err)
	}
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	lc := <-cGot
	if lc == nil || lc.Session().ID() != cc.ID() || lc.Epoch() <= la.Epoch() {
		t.Fatalf("next leader: %v", lc)
	}
}

// Proclaim updates the value; a deposed leader's Proclaim fails and changes
// nothing.
func TestProclaim(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	n := c.Node(lead)
	a, b := newSession(t, n), newSession(t, n)
	ctx := testCtx(t, 10*time.Second)
	la := mustElect(t, a, "svc", "v1")
	if err := la.Proclaim(ctx, []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if info, err := n.Leader(ctx, "svc"); err != nil || string(info.Value) != "v2" || info.Epoch != la.Epoch() {
		t.Fatalf("after Proclaim: %+v %v", info, err)
	}
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	lb := mustElect(t, b, "svc", "b")
	if err := la.Proclaim(ctx, []byte("stale")); !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Fatalf("deposed Proclaim: %v", err)
	}
	if info, err := n.Leader(ctx, "svc"); err != nil || string(info.Value) != "b" || info.Epoch != lb.Epoch() {
		t.Fatalf("deposed Proclaim changed the leadership: %+v %v", info, err)
	}
	if err := lb.Proclaim(ctx, make([]byte, quorumlock.MaxValueBytes+1)); !errors.Is(err, quorumlock.ErrLimit) {
		t.Fatalf("oversized value: %v", err)
	}
}

// Observe reports every leadership in epoch order, "no leader" between
// leaders, never a repeat or a step back, and keeps going after its replica
// loses and regains the cluster.
func TestObserve(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	obsNode := follower(c, lead)
	octx, ocancel := context.WithCancel(context.Background())
	defer ocancel()
	events := c.Node(obsNode).Observe(octx, "sched")
	var got []quorumlock.LeaderInfo
	var gmu sync.Mutex
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for ev := range events {
			gmu.Lock()
			got = append(got, ev)
			gmu.Unlock()
		}
	}()
	// The stream starts with the state at its linearizable read, which
	// may come after the first elections on a loaded machine: wait for
	// that first event before electing.
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		gmu.Lock()
		started := len(got) > 0
		gmu.Unlock()
		if started {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("no first event from Observe")
		}
	}
	n := c.Node(lead)
	s := newSession(t, n)
	ctx := testCtx(t, 30*time.Second)
	var epochs []quorumlock.Token
	for i := range 3 {
		l := mustElect(t, s, "sched", "v")
		epochs = append(epochs, l.Epoch())
		if i == 1 {
			if err := l.Proclaim(ctx, []byte("w")); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The observer's replica is cut off while leaderships come and go.
	c.Isolate(obsNode)
	for range 2 {
		l := mustElect(t, s, "sched", "cut")
		epochs = append(epochs, l.Epoch())
		if err := l.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
	final := mustElect(t, s, "sched", "final")
	epochs = append(epochs, final.Epoch())
	c.Heal()
	deadline := time.Now().Add(10 * time.Second)
	for {
		gmu.Lock()
		done := len(got) > 0 && got[len(got)-1].Epoch == final.Epoch() && got[len(got)-1].HasLeader()
		gmu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("observer never caught up: %+v", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ocancel()
	<-collected
	var seen []quorumlock.Token
	for i, ev := range got {
		if i > 0 {
			prev := got[i-1]
			if ev.Epoch < prev.Epoch {
				t.Fatalf("epoch went back at %d: %+v", i, got)
			}
			if ev.Session == prev.Session && ev.Epoch == prev.Epoch && string(ev.Value) == string(prev.Value) {
				t.Fatalf("event repeated at %d: %+v", i, got)
			}
			if ev.HasLeader() && prev.HasLeader() && ev.Epoch != prev.Epoch {
				t.Fatalf("no 'no leader' event between epochs %d and %d", prev.Epoch, ev.Epoch)
			}
		}
		if ev.HasLeader() && (len(seen) == 0 || seen[len(seen)-1] != ev.Epoch) {
			seen = append(seen, ev.Epoch)
		}
	}
	// Before the cut every epoch is seen; after it the observer may skip
	// the ones it missed, but ends on the final one.
	for _, e := range epochs[:3] {
		found := false
		for _, x := range seen {
			found = found || x == e
		}
		if !found {
			t.Fatalf("epoch %d not observed: %v", e, seen)
		}
	}
}

// Session.Locks lists the session's locks, not the roles it leads (their
// locks live under an internal name that Holder and Release do not accept).
func TestSessionLocksLeaveOutRoles(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	n := c.Node(c.WaitLeader(5 * time.Second))
	s, err := n.NewSession(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(testCtx(t, 10*time.Second))
	if _, err := s.Elect(testCtx(t, 10*time.Second), "sched", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(testCtx(t, 10*time.Second), "a"); err != nil {
		t.Fatal(err)
	}
	locks := s.Locks()
	if len(locks) != 1 || locks[0].Name() != "a" {
		names := make([]string, len(locks))
		for i, l := range locks {
			names[i] = fmt.Sprintf("%q", l.Name())
		}
		t.Fatalf("Locks() = %v, want [\"a\"]", names)
	}
}

// elected is a leadership won by electAfter, and whether the leadership
// before it had ended (Done closed) when it was won.
type elected struct {
	ld       *quorumlock.Leadership
	oldEnded bool
}

// electAfter campaigns for role with s in the background. The channel gets
// the leadership once won, noting whether old's Done had closed by then
// (ld nil if Elect failed, which fails the test).
func electAfter(t *testing.T, s *quorumlock.Session, role string, old *quorumlock.Leadership) <-chan elected {
	got := make(chan elected, 1)
	go func() {
		ld, err := s.Elect(testCtx(t, 20*time.Second), role, []byte("next"))
		if err != nil {
			t.Error(err)
			got <- elected{}
			return
		}
		got <- elected{ld, closed(old.Done())}
	}()
	return got
}
