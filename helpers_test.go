package quorumlock_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// testCtx returns a context bounded for one test step.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func newSession(t *testing.T, n *quorumlock.Node, opts ...quorumlock.SessionOption) *quorumlock.Session {
	t.Helper()
	s, err := n.NewSession(testCtx(t, 10*time.Second), opts...)
	if err != nil {
		t.Fatalf("NewSession on %d: %v", n.ID(), err)
	}
	return s
}

func mustAcquire(t *testing.T, s *quorumlock.Session, name string) *quorumlock.Lock {
	t.Helper()
	l, err := s.Acquire(testCtx(t, 10*time.Second), name)
	if err != nil {
		t.Fatalf("Acquire(%q) by session %d: %v", name, s.ID(), err)
	}
	return l
}

func holder(t *testing.T, n *quorumlock.Node, name string) quorumlock.LockInfo {
	t.Helper()
	info, err := n.Holder(testCtx(t, 10*time.Second), name)
	if err != nil {
		t.Fatalf("Holder(%q) on %d: %v", name, n.ID(), err)
	}
	return info
}

// waitQueued waits until session is among the waiters of name.
func waitQueued(t *testing.T, n *quorumlock.Node, name string, session uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if slices.Contains(holder(t, n, name).Waiters, session) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("session %d never queued for %q", session, name)
}

// follower returns a running replica that is not the leader.
func follower(c *testcluster.Cluster, leader uint64, skip ...uint64) uint64 {
	for _, id := range c.Running() {
		if id != leader && !slices.Contains(skip, id) {
			return id
		}
	}
	return 0
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
