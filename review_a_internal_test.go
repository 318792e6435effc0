package quorumlock

// Regression tests from review A (issue 2's "a leaderless window shorter
// than the TTL loses no lock and expires no session"): an Acquire whose
// withdrawal cannot be confirmed within its ctx returns ctx's error and
// finishes the withdrawal in the background instead of abandoning the
// session.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// The withdrawal goes on after Acquire returns: the session lives on, a
// new waiting Acquire of the name waits for it, and a grant that won the
// race is released by its token (the caller was told it did not get it).
func TestSettleGoesOnInBackground(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	var seen ops
	var withdrawals atomic.Int32
	var released atomic.Uint64
	quorum := make(chan struct{}) // closed: the cluster answers again
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		seen.add(req)
		switch req.GetOp() {
		case lockpb.Op_OP_ACQUIRE:
			if seen.count(lockpb.Op_OP_ACQUIRE) > 1 {
				return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 50}, nil
			}
			<-ctx.Done()
			return nil, ctx.Err()
		case lockpb.Op_OP_WITHDRAW:
			withdrawals.Add(1)
			// The acquire was applied and granted before the
			// withdrawal: the withdrawal reports the grant.
			return answerWhen(ctx, quorum, &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 42})
		case lockpb.Op_OP_RELEASE:
			released.Store(req.GetToken())
		}
		return &lockpb.Response{Code: lockpb.Code_CODE_OK}, nil
	}
	be.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := s.Acquire(ctx, "x")
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrWithdrawPending) || errors.Is(err, ErrSessionExpired) {
		t.Fatalf("Acquire whose withdrawal went unanswered: %v, want the deadline and ErrWithdrawPending", err)
	}
	if s.Err() != nil {
		t.Fatalf("session ended: %v", s.Err())
	}
	eventually(t, "the withdrawal re-sent in the background", func() bool { return withdrawals.Load() == 2 })

	// A new waiting Acquire of x waits for the withdrawal before it
	// queues (else the withdrawal could take its place).
	res := make(chan error, 1)
	go func() {
		l, err := s.Acquire(context.Background(), "x")
		if err == nil && l.Token() != 50 {
			err = errors.New("wrong grant")
		}
		res <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if n := seen.count(lockpb.Op_OP_ACQUIRE); n != 1 {
		t.Fatalf("a new Acquire queued (%d acquires sent) while the withdrawal was unsettled", n)
	}
	close(quorum)
	eventually(t, "the unwanted grant released", func() bool { return released.Load() == 42 })
	if err := <-res; err != nil {
		t.Fatalf("the new Acquire: %v", err)
	}
	if s.Err() != nil {
		t.Fatalf("session ended: %v", s.Err())
	}
	if ls := s.Locks(); len(ls) != 1 || ls[0].Token() != 50 {
		t.Fatalf("locks %v, want the new grant only", ls)
	}
}

// A background withdrawal the cluster refuses (a limit) still abandons
// the session: whether it is queued is unknown.
func TestBackgroundWithdrawalRefusedAbandons(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	var withdrawals atomic.Int32
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		switch req.GetOp() {
		case lockpb.Op_OP_ACQUIRE:
			<-ctx.Done()
			return nil, ctx.Err()
		case lockpb.Op_OP_WITHDRAW:
			if withdrawals.Add(1) == 1 {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return &lockpb.Response{Code: lockpb.Code_CODE_LIMIT}, nil
		}
		return &lockpb.Response{Code: lockpb.Code_CODE_OK}, nil
	}
	be.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(ctx, "x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire: %v", err)
	}
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("session alive after a refused withdrawal")
	}
	if !errors.Is(s.Err(), ErrSessionExpired) {
		t.Fatalf("end cause %v", s.Err())
	}
}
