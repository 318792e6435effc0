package quorumlock

// Regression tests from review D (the background withdrawal of an
// interrupted Acquire, ErrWithdrawPending), on the fake backend.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// An Acquire whose ctx is cancelled long before its deadline settles
// within an election timeout, as one cancelled without a deadline does:
// it returns Canceled with ErrWithdrawPending when no leader answers the
// withdrawal, and does not block until the far deadline (here an hour)
// in a call whose ctx has ended.
func TestReviewDCancelBeforeFarDeadlineSettlesWithinGrace(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	var acquires atomic.Int32
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		switch req.GetOp() {
		case lockpb.Op_OP_ACQUIRE:
			acquires.Add(1)
			<-ctx.Done()
			return nil, ctx.Err()
		case lockpb.Op_OP_WITHDRAW: // no leader
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return &lockpb.Response{Code: lockpb.Code_CODE_OK}, nil
	}
	be.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, "x")
		errc <- err
	}()
	eventually(t, "the acquire sent", func() bool { return acquires.Load() == 1 })
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrWithdrawPending) {
			t.Fatalf("Acquire cancelled without a leader: %v, want Canceled and ErrWithdrawPending", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled Acquire still settles 5 s later (until its deadline, an hour away)")
	}
	if s.Err() != nil {
		t.Fatalf("session ended: %v", s.Err())
	}
}
