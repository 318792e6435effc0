package quorumlock_test

// Regression tests and probes from the review of leader election and
// observation (elect.go, Client.Observe, the service's Watch).

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// nextEvent returns the next event of an Observe stream, failing the test
// if none comes within 10 s or the stream closes.
func nextEvent(t *testing.T, events <-chan quorumlock.LeaderInfo) quorumlock.LeaderInfo {
	t.Helper()
	select {
	case ev, ok := <-events:
		if !ok {
			t.Fatal("Observe stream closed")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no Observe event within 10 s")
	}
	return quorumlock.LeaderInfo{}
}

// waitLeaderEvent reads events until one reports epoch, and returns it.
func waitLeaderEvent(t *testing.T, events <-chan quorumlock.LeaderInfo, epoch quorumlock.Token) quorumlock.LeaderInfo {
	t.Helper()
	for {
		ev := nextEvent(t, events)
		if ev.HasLeader() && ev.Epoch == epoch {
			return ev
		}
		if ev.Epoch > epoch {
			t.Fatalf("observer skipped epoch %d: got %+v", epoch, ev)
		}
	}
}

// A client's Observe that starts on a replica cut off from the majority
// moves on to another replica, as Client.Leader does: the cut-off replica
// cannot serve the initial linearizable read, and the stream must not wait
// for it forever while the rest of the cluster elects leaders.
func TestReviewClientObserveMovesOffCutOffReplica(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	f := follower(c, lead)
	c.Isolate(f)
	// The client reaches every replica; f is first in its list, and it
	// has no session, so it does not know the leader.
	addrs := addrsOf(c, f)
	for _, id := range c.IDs() {
		if id != f {
			addrs = append(addrs, c.Peers()[id])
		}
	}
	cl := dial(t, addrs)
	octx, ocancel := context.WithCancel(context.Background())
	defer ocancel()
	events := cl.Observe(octx, "sched")
	s := newSession(t, c.Node(lead))
	ld := mustElect(t, s, "sched", "v")
	ev := waitLeaderEvent(t, events, ld.Epoch())
	if ev.Session != s.ID() || string(ev.Value) != "v" {
		t.Fatalf("event %+v", ev)
	}
}

// Client.Observe of a role the cluster refuses (longer than the replicas'
// MaxNameBytes, though within the client's) closes its channel, as
// Node.Observe does for an invalid role, instead of retrying forever.
func TestReviewClientObserveInvalidRoleCloses(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1, Configure: func(cfg *quorumlock.Config) { cfg.MaxNameBytes = 8 }})
	c.WaitLeader(5 * time.Second)
	cl := dial(t, addrsOf(c, c.IDs()...))
	role := "a-role-longer-than-eight-bytes"
	if _, err := cl.Leader(testCtx(t, 5*time.Second), role); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Fatalf("Leader of a role the cluster refuses: %v", err)
	}
	events := cl.Observe(testCtx(t, 30*time.Second), role)
	select {
	case ev, ok := <-events:
		if ok {
			t.Fatalf("Observe of a refused role delivered %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Observe of a role the cluster refuses never closed")
	}
}

// Once Done has closed, the leadership is over for its holder: Proclaim is
// refused with ErrNotHeld and publishes nothing, also when the Resign that
// ended it could not confirm the release (the grant is still current on
// the cluster).
func TestReviewProclaimAfterResignRefused(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	n := c.Node(lead)
	s := newSession(t, n)
	ld := mustElect(t, s, "svc", "v1")
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ld.Resign(gone); !errors.Is(err, quorumlock.ErrUnknownOutcome) {
		t.Fatalf("Resign with a cancelled context: %v", err)
	}
	if !closed(ld.Done()) {
		t.Fatal("Done open after Resign")
	}
	ctx := testCtx(t, 10*time.Second)
	if err := ld.Proclaim(ctx, []byte("after")); !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Fatalf("Proclaim after Resign: %v", err)
	}
	if info, err := n.Leader(ctx, "svc"); err == nil && string(info.Value) == "after" {
		t.Fatalf("a resigned leader published %q", info.Value)
	}
}

// A value received from Observe belongs to the receiver: changing it in
// place neither changes what the stream reports next (a later Proclaim of
// the changed bytes is a change, not a repeat) nor what another observer
// of the role receives.
func TestReviewObserveValueOwnedByReceiver(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	lead := c.WaitLeader(5 * time.Second)
	n := c.Node(lead)
	octx, ocancel := context.WithCancel(context.Background())
	defer ocancel()
	o1, o2 := n.Observe(octx, "svc"), n.Observe(octx, "svc")
	if ev := nextEvent(t, o1); ev.HasLeader() {
		t.Fatalf("first event %+v", ev)
	}
	if ev := nextEvent(t, o2); ev.HasLeader() {
		t.Fatalf("first event %+v", ev)
	}
	s := newSession(t, n)
	ld := mustElect(t, s, "svc", "aaa")
	ev1 := waitLeaderEvent(t, o1, ld.Epoch())
	copy(ev1.Value, "bbb")
	if ev2 := waitLeaderEvent(t, o2, ld.Epoch()); string(ev2.Value) != "aaa" {
		t.Fatalf("another observer's change reached this one: %q", ev2.Value)
	}
	if err := ld.Proclaim(testCtx(t, 10*time.Second), []byte("bbb")); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, o1); ev.Epoch != ld.Epoch() || string(ev.Value) != "bbb" {
		t.Fatalf("after Proclaim: %+v", ev)
	}
}

// A session that already leads a role gets its current leadership from
// Elect: when either handle resigns, the leadership is over for both
// before the next candidate is elected (a second Leadership of the same
// grant whose Done stayed open while another session led was two live
// leaders in one process).
func TestReviewSecondElectSharesLeadership(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	const clientID = 100
	cl := dial(t, addrsOf(c, lead), quorumlock.WithDialer(c.Net.Dialer(clientID)))
	s, err := cl.NewSession(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	la := mustElect(t, s, "sched", "a")
	lb := mustElect(t, s, "sched", "b")
	if lb.Epoch() != la.Epoch() {
		t.Fatalf("second Elect of a session that leads: epoch %d, want %d", lb.Epoch(), la.Epoch())
	}
	next := newSession(t, c.Node(lead))
	got := make(chan bool, 1)
	go func() {
		if _, err := next.Elect(testCtx(t, 20*time.Second), "sched", nil); err != nil {
			t.Error(err)
		}
		got <- closed(la.Done()) && closed(lb.Done())
	}()
	waitCandidate(t, c.Node(lead), "sched", next.ID())
	// The resigning process hears the cluster's answers late.
	c.Net.SetDelay(lead, clientID, 100*time.Millisecond)
	if err := la.Resign(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if !<-got {
		t.Fatal("next leader elected while a Leadership of the resigned grant still had a live Done")
	}
	if !closed(lb.Done()) {
		t.Fatal("Done of the second handle open after Resign returned")
	}
}
