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

// A grant that won the race with a withdrawal going on in the background
// is released by it only if no call of the session returned it: a
// TryAcquire answered with that grant first keeps it (no release is sent,
// the Lock stays listed and not lost); one answered after the background
// decided to release it gets ErrNotHeld, never a Lock under which the
// grant is then released.
func TestReviewDBackgroundReleaseSparesAReturnedGrant(t *testing.T) {
	for _, tryFirst := range []bool{true, false} {
		name := "try answered first"
		if !tryFirst {
			name = "background answered first"
		}
		t.Run(name, func(t *testing.T) {
			be, _, s := newLeaseHarness(t, true)
			var acquires atomic.Int32
			var releases atomic.Int32
			quorum := make(chan struct{})
			released := make(chan struct{})
			be.mu.Lock()
			be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
				switch req.GetOp() {
				case lockpb.Op_OP_ACQUIRE:
					if acquires.Add(1) == 1 {
						<-ctx.Done() // the interrupted Acquire
						return nil, ctx.Err()
					}
					if !tryFirst {
						<-released
					}
					// Applied while the session held the grant.
					return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 42}, nil
				case lockpb.Op_OP_WITHDRAW:
					return answerWhen(ctx, quorum, &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 42})
				case lockpb.Op_OP_RELEASE:
					if releases.Add(1) == 1 {
						close(released)
					}
				}
				return &lockpb.Response{Code: lockpb.Code_CODE_OK}, nil
			}
			be.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			if _, err := s.Acquire(ctx, "x"); !errors.Is(err, ErrWithdrawPending) {
				t.Fatalf("Acquire: %v, want ErrWithdrawPending", err)
			}
			if tryFirst {
				l, err := s.TryAcquire(context.Background(), "x")
				if err != nil {
					t.Fatalf("TryAcquire: %v", err)
				}
				close(quorum)
				// The background withdrawal is over once a new waiting
				// Acquire of x gets through.
				if l2, err := s.Acquire(context.Background(), "x"); err != nil || l2 != l {
					t.Fatalf("Acquire after the withdrawal: %v %v", l2, err)
				}
				if releases.Load() != 0 || isDone(l.Lost()) || len(s.Locks()) != 1 {
					t.Fatalf("a returned grant was released under its Lock: %d releases, lost %v", releases.Load(), isDone(l.Lost()))
				}
				return
			}
			errc := make(chan error, 1)
			go func() {
				l, err := s.TryAcquire(context.Background(), "x")
				if err == nil && !isDone(l.Lost()) {
					err = errors.New("returned a live Lock of a grant the session releases")
				}
				errc <- err
			}()
			eventually(t, "the TryAcquire sent", func() bool { return acquires.Load() == 2 })
			close(quorum)
			if err := <-errc; !errors.Is(err, ErrNotHeld) {
				t.Fatalf("TryAcquire answered with the released grant: %v, want ErrNotHeld", err)
			}
			if len(s.Locks()) != 0 || s.Err() != nil {
				t.Fatalf("locks %v, session %v", s.Locks(), s.Err())
			}
		})
	}
}

// Session.Close while a withdrawal goes on in the background (no leader
// yet): a waiting Acquire of the name, held back by that withdrawal,
// returns the session's end instead of hanging; the background goroutine
// ends (the harness's cleanup waits for it) and its request numbers are
// finished.
func TestReviewDCloseWithWithdrawalPending(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	var acquires atomic.Int32
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		switch req.GetOp() {
		case lockpb.Op_OP_ACQUIRE:
			acquires.Add(1)
		case lockpb.Op_OP_CLOSE_SESSION:
			return &lockpb.Response{Code: lockpb.Code_CODE_OK}, nil
		}
		<-ctx.Done() // no leader
		return nil, ctx.Err()
	}
	be.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(ctx, "x"); !errors.Is(err, ErrWithdrawPending) {
		t.Fatalf("Acquire: %v, want ErrWithdrawPending", err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := s.Acquire(context.Background(), "x")
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if n := acquires.Load(); n != 1 {
		t.Fatalf("%d acquires sent while the withdrawal was pending", n)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrSessionExpired) {
			t.Fatalf("waiting Acquire after Close: %v, want ErrSessionExpired", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting Acquire held back by the withdrawal hangs after Close")
	}
	eventually(t, "request numbers finished", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.inflight) == 0 && len(s.acquiring) == 0
	})
}
