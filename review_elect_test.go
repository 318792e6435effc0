package quorumlock_test

// Regression tests and probes from the review of leader election and
// observation (elect.go, Client.Observe, the service's Watch).

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

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

// Probes that held up on the reviewed code; kept as regression tests.

// Elect with a cancelled context, on a closed Node or Client, Resign twice
// and Resign after the session expired: each returns its documented error,
// and none leaves a leader behind.
func TestReviewElectEdgeCases(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: time.Second})
	lead := c.WaitLeader(5 * time.Second)
	n := c.Node(lead)
	ctx := testCtx(t, 20*time.Second)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := n.Elect(gone, "r", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Node.Elect with a cancelled ctx: %v", err)
	}
	s := newSession(t, n)
	if _, err := s.Elect(gone, "r", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Session.Elect with a cancelled ctx: %v", err)
	}
	if _, err := n.Leader(ctx, "r"); !errors.Is(err, quorumlock.ErrNoLeader) {
		t.Fatalf("leader after cancelled candidacies: %v", err)
	}
	for _, bad := range []string{"", "a\x00b", "\xff"} {
		if _, err := s.Elect(ctx, bad, nil); !errors.Is(err, quorumlock.ErrInvalidName) {
			t.Fatalf("Elect(%q): %v", bad, err)
		}
	}
	// The refusal names what was refused: a role, not a lock.
	if _, err := n.Leader(ctx, strings.Repeat("r", 70_000)); !errors.Is(err, quorumlock.ErrInvalidName) || !strings.Contains(err.Error(), `role "rrr`) {
		t.Fatalf("Leader(70,000-byte role): %v, want ErrInvalidName naming the role", err)
	}
	if _, err := s.Elect(ctx, "r", make([]byte, quorumlock.MaxValueBytes+1)); !errors.Is(err, quorumlock.ErrLimit) {
		t.Fatalf("oversized Elect value: %v", err)
	}

	// Resign twice: owned (Node.Elect) and with a caller's session.
	owned, err := n.Elect(ctx, "r", []byte("o"))
	if err != nil {
		t.Fatal(err)
	}
	if err := owned.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := owned.Resign(ctx); err != nil {
		t.Fatalf("second Resign of an owned leadership: %v", err)
	}
	ld := mustElect(t, s, "r", "s")
	if ld.Epoch() <= owned.Epoch() {
		t.Fatalf("epoch %d after %d", ld.Epoch(), owned.Epoch())
	}
	if err := ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ld.Resign(ctx); !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Fatalf("second Resign: %v", err)
	}
	if err := ld.Proclaim(ctx, []byte("x")); !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Fatalf("Proclaim after Resign: %v", err)
	}

	// Resign after the session expired (its replica is cut off).
	f := follower(c, lead)
	fs := newSession(t, c.Node(f))
	fl := mustElect(t, fs, "exp", "")
	c.Isolate(f)
	select {
	case <-fl.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("leadership of a cut-off session never ended")
	}
	if err := fl.Resign(ctx); !errors.Is(err, quorumlock.ErrSessionExpired) {
		t.Fatalf("Resign after expiry: %v", err)
	}
	if err := fl.Proclaim(ctx, nil); !errors.Is(err, quorumlock.ErrSessionExpired) {
		t.Fatalf("Proclaim after expiry: %v", err)
	}
	c.Heal()

	// Closed Client and Node.
	cl := dial(t, addrsOf(c, c.IDs()...))
	cs, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cl.Close()
	if _, err := cs.Elect(ctx, "r", nil); !errors.Is(err, quorumlock.ErrClosed) {
		t.Fatalf("Elect on a closed client's session: %v", err)
	}
	if _, err := cl.Leader(ctx, "r"); !errors.Is(err, quorumlock.ErrClosed) {
		t.Fatalf("Leader on a closed client: %v", err)
	}
	if _, ok := <-cl.Observe(ctx, "r"); ok {
		t.Fatal("Observe on a closed client delivered")
	}
	c.Stop(f)
	fn := c.Node(follower(c, lead))
	c.Stop(fn.ID())
	if _, err := fn.Elect(ctx, "r", nil); !errors.Is(err, quorumlock.ErrClosed) {
		t.Fatalf("Elect on a closed node: %v", err)
	}
	if _, err := fn.Leader(ctx, "r"); !errors.Is(err, quorumlock.ErrClosed) {
		t.Fatalf("Leader on a closed node: %v", err)
	}
	if _, ok := <-fn.Observe(ctx, "r"); ok {
		t.Fatal("Observe on a closed node delivered")
	}
}

// Epochs keep growing across snapshots and a restart of every replica; a
// waiting candidate's value survives them and becomes the role's value
// when it is elected; Observe on a restarted replica starts from the
// current leader.
func TestReviewEpochsAcrossSnapshotsAndRestart(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, Configure: func(cfg *quorumlock.Config) { cfg.SnapshotEntries = 8 }})
	lead := c.WaitLeader(5 * time.Second)
	ctx := testCtx(t, 60*time.Second)
	a := newSession(t, c.Node(lead))
	var last quorumlock.Token
	for range 6 {
		ld := mustElect(t, a, "sched", "a")
		if ld.Epoch() <= last {
			t.Fatalf("epoch %d after %d", ld.Epoch(), last)
		}
		last = ld.Epoch()
		if err := ld.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held := mustElect(t, a, "sched", "held")
	b := newSession(t, c.Node(lead), quorumlock.WithTTL(time.Minute))
	bGot := make(chan error, 1)
	go func() { _, err := b.Elect(ctx, "sched", []byte("waiting")); bGot <- err }()
	waitCandidate(t, c.Node(lead), "sched", b.ID())
	// More entries so that every replica snapshots with b queued.
	for range 20 {
		if err := mustAcquire(t, a, "filler").Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c.StopAll()
	for _, id := range c.IDs() {
		c.Restart(id)
	}
	lead = c.WaitLeader(10 * time.Second)
	// a's and b's sessions lived on the stopped replicas: a expires (it
	// has no heartbeats) after the new leader's fresh TTL, and b, the
	// queued candidate, is elected with its value, then expires too.
	events := c.Node(lead).Observe(ctx, "sched")
	first := nextEvent(t, events)
	if !first.HasLeader() || first.Epoch != held.Epoch() || string(first.Value) != "held" {
		t.Fatalf("first event after restart: %+v (held epoch %d)", first, held.Epoch())
	}
	var got quorumlock.LeaderInfo
	for {
		ev := nextEvent(t, events)
		if ev.HasLeader() {
			got = ev
			break
		}
	}
	if got.Session != b.ID() || got.Epoch <= held.Epoch() || string(got.Value) != "waiting" {
		t.Fatalf("next leader after restart: %+v", got)
	}
	<-bGot
}

// A client's Observe survives the death of the replica serving it: it
// re-subscribes elsewhere and reports the latest state, epochs never
// decreasing and "no leader" between leaders.
func TestReviewClientObserveSurvivesReplicaDeath(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	cl := dial(t, addrsOf(c, lead, follower(c, lead)))
	octx, ocancel := context.WithCancel(context.Background())
	defer ocancel()
	events := cl.Observe(octx, "sched")
	nextEvent(t, events)
	f := follower(c, lead)
	s := newSession(t, c.Node(f))
	ld := mustElect(t, s, "sched", "1")
	waitLeaderEvent(t, events, ld.Epoch())
	c.Stop(lead) // the replica the stream started on (Dial's first)
	if err := ld.Resign(testCtx(t, 20*time.Second)); err != nil {
		t.Fatal(err)
	}
	ld2 := mustElect(t, s, "sched", "2")
	var prev quorumlock.LeaderInfo
	sawNone := false
	for {
		ev := nextEvent(t, events)
		if ev.Epoch < prev.Epoch {
			t.Fatalf("epoch went back: %+v after %+v", ev, prev)
		}
		sawNone = sawNone || !ev.HasLeader()
		prev = ev
		if ev.HasLeader() && ev.Epoch == ld2.Epoch() {
			break
		}
	}
	if !sawNone || string(prev.Value) != "2" {
		t.Fatalf("last %+v, saw no-leader %v", prev, sawNone)
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

// Observers on a replica and through a client, one of them never reading,
// and leaderships resigned or lost leave no goroutine behind once their
// contexts end; a slow observer still ends on the latest state.
func TestReviewObserveNoLeakSlowConsumer(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	n := c.Node(lead)
	cl := dial(t, addrsOf(c, c.IDs()...))
	s := newSession(t, n)
	time.Sleep(100 * time.Millisecond)
	ignore := goleak.IgnoreCurrent()

	octx, ocancel := context.WithCancel(context.Background())
	idle := n.Observe(octx, "sched")    // never read
	remote := cl.Observe(octx, "sched") // read only at the end
	slow := n.Observe(octx, "sched")
	nextEvent(t, slow)
	var last quorumlock.Token
	for i := range 40 {
		ld := mustElect(t, s, "sched", "v")
		if i%2 == 0 {
			if err := ld.Proclaim(testCtx(t, 10*time.Second), []byte("w")); err != nil {
				t.Fatal(err)
			}
		}
		last = ld.Epoch()
		if i < 39 {
			if err := ld.Resign(testCtx(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitLeaderEvent(t, slow, last)
	waitLeaderEvent(t, remote, last)
	ocancel()
	for _, ch := range []<-chan quorumlock.LeaderInfo{idle, remote, slow} {
		for range ch {
		}
	}
	if err := s.Close(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, ignore)
}
