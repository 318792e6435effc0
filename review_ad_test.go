package quorumlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// TestReviewADElectionCallsReturnWithinContextWithoutQuorum (invariant 12):
// the election calls that TestCallsReturnWithinContextWithoutQuorum does
// not exercise (Proclaim, Resign, Leader, Elect, and Observe's channel)
// return within their context on a replica cut off from the majority.
// Mutations it catches (review AD): Proclaim, or Resign's release, sent
// under context.Background() instead of the caller's ctx.
func TestReviewADElectionCallsReturnWithinContextWithoutQuorum(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 4 * time.Second})
	lead := c.WaitLeader(5 * time.Second)
	x := follower(c, lead)
	n := c.Node(x)
	s := newSession(t, n)
	ectx, ecancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ecancel()
	lp, err := s.Elect(ectx, "proclaimer", []byte("v1"))
	if err != nil {
		t.Fatalf("Elect: %v", err)
	}
	lr, err := s.Elect(ectx, "resigner", nil)
	if err != nil {
		t.Fatalf("Elect: %v", err)
	}
	s2 := newSession(t, n)
	check := cutOffChecker(t, c, x)
	check("Proclaim", func(ctx context.Context) error { return lp.Proclaim(ctx, []byte("v2")) }, quorumlock.ErrUnknownOutcome)
	check("Leader", func(ctx context.Context) error { _, err := n.Leader(ctx, "proclaimer"); return err }, context.DeadlineExceeded)
	check("Elect", func(ctx context.Context) error { _, err := s2.Elect(ctx, "proclaimer", nil); return err }, context.DeadlineExceeded)
	check("Observe", func(ctx context.Context) error {
		for range n.Observe(ctx, "proclaimer") {
		}
		return ctx.Err()
	}, context.DeadlineExceeded)
	check("Resign", func(ctx context.Context) error { return lr.Resign(ctx) }, quorumlock.ErrUnknownOutcome)
}
