package quorumlock

// Probes and regression tests from review F (the background withdrawal
// of an interrupted Acquire, ErrWithdrawPending), on the fake backend.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// bookkeepingClear reports whether s has no request in flight and no
// acquire bookkeeping left.
func bookkeepingClear(s *Session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inflight) == 0 && len(s.acquiring) == 0 && len(s.calls) == 0
}

// Two waiting Acquires of one name interrupted without a leader: the
// first leaves the place to the second (it takes back its own request
// only), the second withdraws the place; both go on in the background.
// Once a leader answers, every request number is finished, the
// bookkeeping is gone, the session lives, and a new Acquire of the name
// gets through.
func TestReviewFTwoCallsOfOneNameWithdrawInBackground(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	var seen ops
	quorum := make(chan struct{})
	var granted atomic.Bool
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		seen.add(req)
		select {
		case <-quorum:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		switch req.GetOp() {
		case lockpb.Op_OP_ACQUIRE:
			granted.Store(true)
			return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 77}, nil
		case lockpb.Op_OP_WITHDRAW:
			return &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}, nil
		}
		return &lockpb.Response{Code: lockpb.Code_CODE_OK}, nil
	}
	be.mu.Unlock()

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, d := range []time.Duration{80 * time.Millisecond, 300 * time.Millisecond} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			_, errs[i] = s.Acquire(ctx, "x")
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, ErrWithdrawPending) {
			t.Fatalf("Acquire %d: %v, want ErrWithdrawPending", i, err)
		}
	}
	if seen.count(takeBack) == 0 || seen.count(lockpb.Op_OP_WITHDRAW) == 0 {
		t.Fatalf("take-backs %d, withdrawals %d: want one of each", seen.count(takeBack), seen.count(lockpb.Op_OP_WITHDRAW))
	}
	close(quorum)
	eventually(t, "the background withdrawals finished", func() bool { return bookkeepingClear(s) })
	if s.Err() != nil {
		t.Fatalf("session ended: %v", s.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if l, err := s.Acquire(ctx, "x"); err != nil || l.Token() != 77 {
		t.Fatalf("Acquire after the withdrawals: %v, %v", l, err)
	}
}

// A background release of an unwanted grant refused for the session's
// requests in flight (a limit) is sent again, not given up: the grant is
// released and the session lives.
func TestReviewFBackgroundReleaseRefusedIsRetried(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	quorum := make(chan struct{})
	var releases atomic.Int32
	var released atomic.Uint64
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		switch req.GetOp() {
		case lockpb.Op_OP_ACQUIRE:
			<-ctx.Done()
			return nil, ctx.Err()
		case lockpb.Op_OP_WITHDRAW:
			return answerWhen(ctx, quorum, &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 42})
		case lockpb.Op_OP_RELEASE:
			if releases.Add(1) <= 2 {
				return &lockpb.Response{Code: lockpb.Code_CODE_LIMIT}, nil
			}
			released.Store(req.GetToken())
		}
		return &lockpb.Response{Code: lockpb.Code_CODE_OK}, nil
	}
	be.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(ctx, "x"); !errors.Is(err, ErrWithdrawPending) {
		t.Fatalf("Acquire: %v, want ErrWithdrawPending", err)
	}
	close(quorum)
	eventually(t, "the unwanted grant released", func() bool { return released.Load() == 42 })
	eventually(t, "the background withdrawal finished", func() bool { return bookkeepingClear(s) })
	if s.Err() != nil {
		t.Fatalf("session ended: %v", s.Err())
	}
}

// An Acquire of a lock the session already holds, interrupted without a
// leader, returns ErrWithdrawPending; when a leader answers the
// background withdrawal with that grant, the Lock the session holds stays
// held (no release is sent, Lost stays open), as ErrWithdrawPending's doc
// says.
func TestReviewFHeldLockSurvivesPendingReentrantAcquire(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	l, err := s.Acquire(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	tok := uint64(l.Token())
	quorum := make(chan struct{})
	var releases atomic.Int32
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		switch req.GetOp() {
		case lockpb.Op_OP_ACQUIRE:
			<-ctx.Done() // no leader
			return nil, ctx.Err()
		case lockpb.Op_OP_WITHDRAW:
			// The session holds x: the withdrawal reports it.
			return answerWhen(ctx, quorum, &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: tok})
		case lockpb.Op_OP_RELEASE:
			releases.Add(1)
		}
		return &lockpb.Response{Code: lockpb.Code_CODE_OK}, nil
	}
	be.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(ctx, "x"); !errors.Is(err, ErrWithdrawPending) {
		t.Fatalf("Acquire: %v, want ErrWithdrawPending", err)
	}
	close(quorum)
	eventually(t, "the background withdrawal finished", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.inflight) == 0 && len(s.acquiring) == 0
	})
	if releases.Load() != 0 || isDone(l.Lost()) || len(s.Locks()) != 1 || s.Err() != nil {
		t.Fatalf("held Lock after the withdrawal: %d releases, lost %v, locks %v, session %v", releases.Load(), isDone(l.Lost()), s.Locks(), s.Err())
	}
}
