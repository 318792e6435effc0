package quorumlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// Two Acquire calls of one session wait for the same lock; the second
// gives up. The first (its context alive) must still be granted when the
// holder releases: the second left the session's place in the queue to it.
func TestSecondWaiterGivingUpKeepsTheFirst(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 30 * time.Second})
	lead := c.WaitLeader(10 * time.Second)
	s1 := newSession(t, c.Node(lead))
	s2 := newSession(t, c.Node(follower(c, lead)))
	l1 := mustAcquire(t, s1, "x")
	res := make(chan error, 1)
	go func() {
		_, err := s2.Acquire(testCtx(t, 20*time.Second), "x")
		res <- err
	}()
	waitQueued(t, c.Node(lead), "x", s2.ID())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := s2.Acquire(ctx, "x")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the second Acquire after its deadline: %v", err)
	}
	if err := l1.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("the first Acquire: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the first Acquire still waits 10 s after the lock was freed; holder %+v", holder(t, c.Node(lead), "x"))
	}
	if info := holder(t, c.Node(lead), "x"); info.Holder != s2.ID() {
		t.Fatalf("x held by %d, want session %d", info.Holder, s2.ID())
	}
}

// A session whose Acquire waits for long (a candidate in an election does)
// goes on working: its other requests list the waiting one as in flight,
// so the cluster forgets their outcomes instead of keeping every one of
// them until the wait ends (it kept at most 1,024 per session: then every
// request failed with ErrLimit).
func TestLongWaitDoesNotPinOutcomes(t *testing.T) {
	t.Parallel()
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 30 * time.Second})
	lead := c.WaitLeader(10 * time.Second)
	n := c.Node(lead)
	other := newSession(t, n)
	s := newSession(t, n)
	mustAcquire(t, other, "a")
	wait, stop := context.WithCancel(context.Background())
	defer stop()
	waited := make(chan error, 1)
	go func() {
		_, err := s.Acquire(wait, "a")
		waited <- err
	}()
	waitQueued(t, n, "a", s.ID())
	for i := range 600 { // 1,200 requests while the acquire waits
		l, err := s.TryAcquire(testCtx(t, 5*time.Second), "b")
		if err != nil {
			t.Fatalf("TryAcquire #%d while an acquire waits: %v", i, err)
		}
		if err := l.Release(testCtx(t, 5*time.Second)); err != nil {
			t.Fatalf("Release #%d while an acquire waits: %v", i, err)
		}
	}
	stop()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiting acquire after its cancellation: %v", err)
	}
	if info := holder(t, n, "a"); len(info.Waiters) != 0 {
		t.Fatalf("the cancelled acquire is still queued: %+v", info)
	}
}
