package quorumlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// TestReviewADCancelledAcquireSettlesWithinGrace (invariant 12): an
// Acquire cancelled while waiting, whose withdrawal the cluster never
// answers (no leader), returns about one settle grace (here 100 ms) after
// the cancellation, with ctx's error and ErrWithdrawPending; the
// withdrawal goes on in the background. The bound asserted is six graces,
// far above the expected time. Mutation it catches (review AD): settle
// waiting for the withdrawal ten times its budget.
func TestReviewADCancelledAcquireSettlesWithinGrace(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		switch req.GetOp() {
		case lockpb.Op_OP_ACQUIRE, lockpb.Op_OP_WITHDRAW:
			<-ctx.Done() // no leader: never answered
			return nil, ctx.Err()
		}
		return &lockpb.Response{Code: lockpb.Code_CODE_OK}, nil
	}
	be.mu.Unlock()

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx, "x")
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond) // the acquire is waiting
	cancel()
	start := time.Now()
	grace := be.settleGrace()
	var err error
	select {
	case err = <-errc:
	case <-time.After(30 * grace):
		t.Fatalf("the cancelled Acquire still running %v after its cancellation", time.Since(start))
	}
	if took := time.Since(start); took > 6*grace {
		t.Errorf("the cancelled Acquire returned %v after its cancellation, want about the settle grace %v", took, grace)
	}
	if !errors.Is(err, context.Canceled) || !errors.Is(err, ErrWithdrawPending) {
		t.Errorf("the cancelled Acquire: %v, want context.Canceled joined with ErrWithdrawPending", err)
	}
	if s.Err() != nil {
		t.Errorf("session ended: %v", s.Err())
	}
}
