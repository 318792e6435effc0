package quorumlock_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// TestReviewHWaiterWithLaterRequestSurvivesLeaderLoss: a waiting Acquire
// keeps its (session, seq) through a leader change even when the session
// made a later request while it waited (DESIGN.md invariant 6: a retry
// returns the original outcome). Mutation it catches (review H): a request
// whose done mark ignores the session's requests in flight below it
// (Session.numberedLocked) retires the waiting acquire's seq, so its
// re-send to the new leader is refused as stale and the waiter never gets
// the lock.
func TestReviewHWaiterWithLaterRequestSurvivesLeaderLoss(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	f1 := follower(c, lead)
	f2 := follower(c, lead, f1)
	h := newSession(t, c.Node(f1))
	w := newSession(t, c.Node(f2))
	hl := mustAcquire(t, h, "m")
	got := acquireAsync(testCtx(t, 30*time.Second), w, "m")
	waitQueued(t, c.Node(f1), "m", w.ID())
	// A later request of the waiting session, answered while the acquire
	// of "m" is still in flight.
	ol := mustAcquire(t, w, "other")
	c.Stop(lead)
	newLead := c.WaitLeader(5 * time.Second)
	// Give the waiter's router time to re-send to the new leader.
	time.Sleep(200 * time.Millisecond)
	info := holder(t, c.Node(newLead), "m")
	if info.Holder != h.ID() || !slices.Equal(info.Waiters, []uint64{w.ID()}) {
		t.Fatalf("table after failover: %+v", info)
	}
	if err := hl.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	var r acquireResult
	select {
	case r = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting Acquire never returned")
	}
	if r.err != nil || r.l == nil || r.l.Token() <= hl.Token() {
		t.Fatalf("waiter after failover and release: lock %v, err %v; want a grant above token %d", r.l, r.err, hl.Token())
	}
	if info := holder(t, c.Node(newLead), "m"); info.Holder != w.ID() {
		t.Fatalf("table after hand-off: %+v", info)
	}
	if info := holder(t, c.Node(newLead), "other"); info.Holder != w.ID() || info.Token != ol.Token() {
		t.Fatalf("the later grant changed: %+v, want holder %d token %d", info, w.ID(), ol.Token())
	}
}

// TestReviewHStaleLockReleaseKeepsNewerGrant: Release of a Lock names that
// Lock's own token, so a late Release of an earlier grant never frees the
// session's newer grant of the same name (DESIGN.md invariant 7). Mutation
// it catches (review H): Lock.Release sending the token of the session's
// current Lock of that name instead of its own.
func TestReviewHStaleLockReleaseKeepsNewerGrant(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	s := newSession(t, c.Node(lead))
	l1 := mustAcquire(t, s, "a")
	if err := l1.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatalf("first Release: %v", err)
	}
	l2 := mustAcquire(t, s, "a")
	if l2.Token() <= l1.Token() {
		t.Fatalf("second grant token %d not above %d", l2.Token(), l1.Token())
	}
	if err := l1.Release(testCtx(t, 5*time.Second)); !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Fatalf("late Release of the first grant: %v, want ErrNotHeld", err)
	}
	if info := holder(t, c.Node(lead), "a"); info.Holder != s.ID() || info.Token != l2.Token() {
		t.Fatalf("after the late Release: %+v, want holder %d token %d", info, s.ID(), l2.Token())
	}
	select {
	case <-l2.Lost():
		t.Fatal("the newer Lock's Lost closed after a late Release of the earlier one")
	default:
	}
	if err := l2.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatalf("Release of the newer grant: %v", err)
	}
}
