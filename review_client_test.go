package quorumlock_test

// Regression tests from the review of the remote client, elections, reads,
// leases and fencing. Each test fails on the code it was written against.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// gateClock is the real clock, except that once armed, the next AfterFunc
// call stops until the test lets it go: the test can act between a remote
// NewSession's answer and the arming of the new session's lease timer.
type gateClock struct {
	clock.Clock
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newGateClock() *gateClock {
	return &gateClock{Clock: clock.Real(), entered: make(chan struct{}), release: make(chan struct{})}
}

func (g *gateClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	if g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.release
	}
	return g.Clock.AfterFunc(d, f)
}

// Client.Close ends every session opened through the client. A NewSession
// whose answer arrived just before Close must not hand back a session that
// Close missed: that session stays "alive" (Done open, no error) after the
// client is closed, is never heartbeated, and when its lease runs out it
// tries to close itself over a client whose connections are gone (redialing
// one that nothing closes).
func TestReviewClientCloseRacesNewSession(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	c.WaitLeader(5 * time.Second)
	gc := newGateClock()
	cl, err := quorumlock.Dial(testCtx(t, 10*time.Second), addrsOf(c, c.IDs()...),
		quorumlock.WithClock(gc), quorumlock.WithSessionTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	gc.armed.Store(true)
	type result struct {
		s   *quorumlock.Session
		err error
	}
	got := make(chan result, 1)
	go func() {
		s, err := cl.NewSession(testCtx(t, 10*time.Second))
		got <- result{s, err}
	}()
	select {
	case <-gc.entered: // the cluster answered; the session is being built
	case <-time.After(10 * time.Second):
		t.Fatal("NewSession never reached its lease timer")
	}
	closeDone := make(chan struct{})
	go func() { cl.Close(); close(closeDone) }()
	select {
	case <-closeDone:
	case <-time.After(5 * time.Second):
		t.Fatal("Client.Close blocked")
	}
	close(gc.release)
	r := <-got
	if r.err != nil {
		if !errors.Is(r.err, quorumlock.ErrClosed) {
			t.Fatalf("NewSession across Close: %v", r.err)
		}
		return
	}
	select {
	case <-r.s.Done():
	case <-time.After(200 * time.Millisecond):
		t.Fatalf("session %d returned by NewSession is alive after Client.Close returned (Err=%v)", r.s.ID(), r.s.Err())
	}
}

// A Leadership's Done closes before any other candidate can be elected.
// Resign must not let the next candidate lead while the resigning leader's
// Context is still live: the old leader's work runs under that Context.
func TestReviewResignEndsLeadershipBeforeNextElected(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	const clientID = 100
	cl := dial(t, addrsOf(c, lead), quorumlock.WithDialer(c.Net.Dialer(clientID)))
	old, err := cl.NewSession(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	la := mustElect(t, old, "sched", "old")
	next := newSession(t, c.Node(lead))
	got := electAfter(t, next, "sched", la)
	waitCandidate(t, c.Node(lead), "sched", next.ID())
	// The resigning leader's process hears the cluster's answers late (a
	// slow link from the leader replica to it).
	c.Net.SetDelay(lead, clientID, 100*time.Millisecond)
	if err := la.Resign(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	e := <-got
	if e.ld == nil {
		t.FailNow()
	}
	if !e.oldEnded {
		t.Fatalf("epoch %d elected while the resigning leader (epoch %d) still had a live Done/Context", e.ld.Epoch(), la.Epoch())
	}
}

// A Release whose answer comes too late returns ErrUnknownOutcome and the
// Lock stays listed; if the release did apply and the session then takes the
// lock again, the new grant replaces the old Lock in the session's table
// without marking it lost. The old Lock's Lost channel then never closes,
// not even when the session ends: a holder still watching it believes
// forever (invariant 5: past the session's end every Lost closes).
func TestReviewReplacedLockLostCloses(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	const clientID = 100
	cl := dial(t, addrsOf(c, lead), quorumlock.WithDialer(c.Net.Dialer(clientID)))
	s, err := cl.NewSession(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l1 := mustAcquire(t, s, "res")
	lost1 := l1.Lost()
	// The answer to the release is late: the caller gives up first.
	c.Net.SetDelay(lead, clientID, 300*time.Millisecond)
	rctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err = l1.Release(rctx)
	cancel()
	if !errors.Is(err, quorumlock.ErrUnknownOutcome) {
		t.Fatalf("Release with a late answer: %v", err)
	}
	c.Net.Heal()
	// The release did apply: the lock is free on the cluster.
	waitFree := time.Now().Add(5 * time.Second)
	for holder(t, c.Node(lead), "res").Holder != 0 {
		if time.Now().After(waitFree) {
			t.Fatal("release never applied")
		}
		time.Sleep(5 * time.Millisecond)
	}
	l2 := mustAcquire(t, s, "res")
	if l2.Token() <= l1.Token() {
		t.Fatalf("new grant %d not above %d", l2.Token(), l1.Token())
	}
	if !closed(lost1) {
		t.Errorf("Lost of the released grant (token %d) still open after the session was granted token %d", l1.Token(), l2.Token())
	}
	if err := s.Close(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost1:
	case <-time.After(2 * time.Second):
		t.Fatalf("Lost of lock %q token %d never closed after its session ended", l1.Name(), l1.Token())
	}
}

// RevokeSession re-sends its request after an attempt whose answer was lost
// (invariant 6: a retry returns the original outcome). When the first copy
// did revoke the session, the retry finds it gone and the operator is told
// ErrSessionExpired ("no live session"), although the revocation took
// effect and the session was live when it was asked for.
func TestReviewRevokeRetryReportsOriginalOutcome(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	victim := newSession(t, c.Node(follower(c, lead)))
	const clientID = 100
	cl := dial(t, addrsOf(c, lead), quorumlock.WithDialer(c.Net.Dialer(clientID)))
	if _, err := cl.Holder(testCtx(t, 5*time.Second), "warm"); err != nil {
		t.Fatal(err)
	}
	// The leader's answers reach the client later than its attempt limit
	// (twice the election timeout, 200 ms here).
	c.Net.SetDelay(lead, clientID, 400*time.Millisecond)
	time.AfterFunc(300*time.Millisecond, c.Net.Heal)
	err := cl.RevokeSession(testCtx(t, 10*time.Second), victim.ID())
	select {
	case <-victim.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("victim not revoked")
	}
	if err != nil {
		t.Fatalf("RevokeSession of live session %d, which it revoked: %v", victim.ID(), err)
	}
}
