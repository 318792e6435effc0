package quorumlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// waiterBesideReleasedGrant sets up the race of the tests below on a
// backend that answers the first acquire of "x" with grant 5 and holds the
// second's answer: the session acquires x (token 5), a second Acquire waits
// (inFlight reports its request reached the backend), and 5 is released.
// The waiting call's outcome comes on the returned channel (see receive).
func waiterBesideReleasedGrant(t *testing.T, s *Session, inFlight func() bool) <-chan acquireResult {
	t.Helper()
	ctx := context.Background()
	l5, err := s.Acquire(ctx, "x")
	if err != nil || l5.Token() != 5 {
		t.Fatalf("first Acquire: %v, %v", l5, err)
	}
	yErr := make(chan acquireResult, 1)
	go func() {
		l, err := s.Acquire(ctx, "x")
		yErr <- acquireResult{l, err}
	}()
	eventually(t, "the waiting call in flight", inFlight)
	if err := l5.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return yErr
}

// acquireResult is the outcome of an Acquire run in a goroutine.
type acquireResult struct {
	l   *Lock
	err error
}

// receive waits (up to 10 s) for the outcome of an Acquire on ch.
func receive(t *testing.T, ch <-chan acquireResult) (*Lock, error) {
	t.Helper()
	select {
	case r := <-ch:
		return r.l, r.err
	case <-time.After(10 * time.Second):
		t.Fatal("the Acquire did not return in 10 s")
		return nil, nil
	}
}

// lateGrant scripts a backend for the tests below: x's first acquire is
// granted 5; the second (the waiting call of waiterBesideReleasedGrant)
// is answered grant 5 only when yAnswer closes; the third is applied on
// the free lock, granted 9, and its answer lost (it returns when its ctx
// ends); a copy of it (a recheck) is answered with that outcome. A
// take-back is answered by takeBack (n counts them; called without mu),
// a withdrawal of the place by name with the grant the session holds
// (9), if any.
type lateGrant struct {
	mu       sync.Mutex
	acquires int
	lateSeq  uint64 // the acquire granted 9
	held     map[uint64]bool
	rechecks int
	releases []uint64
	yAnswer  chan struct{}
	// grantOnArrival: 9 is granted when the third acquire arrives (else
	// when takeBack says so, by setting held[9] under mu).
	grantOnArrival bool
	takeBack       func(ctx context.Context, n int) (*lockpb.Response, error)
	takeBacks      int
}

func newLateGrant(be *fakeBackend, grantOnArrival bool, takeBack func(ctx context.Context, n int) (*lockpb.Response, error)) *lateGrant {
	f := &lateGrant{held: map[uint64]bool{5: true}, yAnswer: make(chan struct{}), grantOnArrival: grantOnArrival, takeBack: takeBack}
	be.mu.Lock()
	be.handle = f.handle
	be.mu.Unlock()
	return f
}

func (f *lateGrant) handle(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
	f.mu.Lock()
	switch {
	case req.GetOp() == lockpb.Op_OP_ACQUIRE && f.lateSeq != 0 && req.GetSeq() == f.lateSeq:
		// A copy of the applied acquire: its outcome.
		f.rechecks++
		f.mu.Unlock()
		return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 9}, nil
	case req.GetOp() == lockpb.Op_OP_ACQUIRE:
		f.acquires++
		switch f.acquires {
		case 1: // x's first grant
			f.mu.Unlock()
			return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 5}, nil
		case 2: // the waiting call: answered grant 5, late
			f.mu.Unlock()
			<-f.yAnswer
			return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 5}, nil
		default: // applied after 5 was released: granted 9, answer lost
			f.lateSeq = req.GetSeq()
			if f.grantOnArrival {
				f.held[9] = true
			}
			f.mu.Unlock()
			<-ctx.Done()
			return nil, ctx.Err()
		}
	case req.GetOp() == lockpb.Op_OP_RELEASE:
		f.releases = append(f.releases, req.GetToken())
		delete(f.held, req.GetToken())
		f.mu.Unlock()
		return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: req.GetToken()}, nil
	case req.GetOp() == lockpb.Op_OP_WITHDRAW && req.GetName() == "":
		f.takeBacks++
		n := f.takeBacks
		f.mu.Unlock()
		return f.takeBack(ctx, n)
	case req.GetOp() == lockpb.Op_OP_WITHDRAW:
		held9 := f.held[9]
		f.mu.Unlock()
		if held9 {
			return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 9}, nil
		}
		return &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}, nil
	}
	f.mu.Unlock()
	return nil, errors.New("unexpected request")
}

// waiting reports whether the waiting call's acquire is in flight.
func (f *lateGrant) waiting() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.acquires == 2
}

// A call that stops waiting beside another waiting call of its session
// leaves the place to it and takes back its own request only. If that
// request was applied and granted a free lock, the other call need not
// learn of the grant: its own answer may be an older grant of the place,
// released since by a third call. The call that stopped must then find the
// grant itself (it asks for its request's outcome again), or the session
// holds a lock nobody knows of until it ends (found by
// TestReviewJSharedSessionStress under load: "the table shows session 5
// holding token 6245; the session does not know it").
func TestTakenBackAcquireFindsItsGrant(t *testing.T) {
	for _, try := range []bool{false, true} {
		name := "Acquire"
		if try {
			name = "TryAcquire"
		}
		t.Run(name, func(t *testing.T) {
			be, _, s := newLeaseHarness(t, true)
			f := newLateGrant(be, true, func(context.Context, int) (*lockpb.Response, error) {
				// The target was applied: nothing to take back.
				return &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}, nil
			})
			yErr := waiterBesideReleasedGrant(t, s, f.waiting)
			tctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			var l *Lock
			var err error
			if try {
				l, err = s.TryAcquire(tctx, "x")
			} else {
				l, err = s.Acquire(tctx, "x")
			}
			cancel()
			close(f.yAnswer)
			// The waiting call must not return the released grant 5. It
			// ends with ErrNotHeld, or, having withdrawn the place left to
			// it, with the grant the session holds: 9, the same Lock.
			if yl, yerr := receive(t, yErr); yerr == nil {
				if err != nil || yl != l {
					t.Errorf("the waiting call returned %v, want ErrNotHeld or the other call's Lock (%v, %v)", yl, l, err)
				}
			} else if !errors.Is(yerr, ErrNotHeld) {
				t.Errorf("the waiting call answered with the released grant 5: %v, want ErrNotHeld", yerr)
			}
			f.mu.Lock()
			still9, n := f.held[9], f.rechecks
			f.mu.Unlock()
			if n != 1 {
				t.Errorf("%d rechecks of the taken-back acquire, want 1", n)
			}
			if err != nil {
				t.Errorf("the call whose request was granted 9: %v (want the Lock: the grant won the race)", err)
			} else if l.Token() != 9 {
				t.Errorf("the call returned token %d, want 9", l.Token())
			}
			if still9 {
				known := false
				for _, l := range s.Locks() {
					known = known || (l.Name() == "x" && l.Token() == 9)
				}
				if !known {
					t.Errorf("the cluster holds x with token 9 for the session, which does not know it (Locks %v)", s.Locks())
				}
			}
		})
	}
}

// The same when the take-back is not answered in time (ErrWithdrawPending):
// the background settling asks for the request's outcome once the
// take-back is answered. The caller was told it did not get the lock, so
// a grant found then is released, if no call of the session still waits
// for the name. If one does, the grant is left to it: the answer cannot
// tell a grant of the request's own from the grant of the place it queued
// in, which the waiting call is about to take (releasing it freed the
// lock under that call: found under -race, in
// TestConcurrentWaitsShareTheQueuePlace). The waiting call below is
// answered with an earlier grant, released since, and still ends with
// the grant: it withdraws the place left to it, which answers with the
// grant the session holds.
func TestTakenBackAcquireGrantReleasedInBackground(t *testing.T) {
	for _, waiting := range []bool{false, true} {
		t.Run(fmt.Sprint("call still waiting=", waiting), func(t *testing.T) {
			be, _, s := newLeaseHarness(t, true)
			applyTarget := make(chan struct{})
			var f *lateGrant
			f = newLateGrant(be, false, func(ctx context.Context, n int) (*lockpb.Response, error) {
				if n == 1 { // no leader answers in time
					<-ctx.Done()
					return nil, ctx.Err()
				}
				select {
				case <-applyTarget:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				f.mu.Lock()
				f.held[9] = true // the target was applied first, on the free lock
				f.mu.Unlock()
				return &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}, nil
			})

			yErr := waiterBesideReleasedGrant(t, s, f.waiting)
			tctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			_, err := s.Acquire(tctx, "x")
			cancel()
			if !errors.Is(err, ErrWithdrawPending) {
				t.Fatalf("Acquire whose take-back was not answered: %v, want ErrWithdrawPending", err)
			}
			f.mu.Lock()
			target := f.lateSeq
			f.mu.Unlock()
			settled := func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				_, inFlight := s.inflight[target]
				return !inFlight
			}
			if waiting {
				close(applyTarget)
				eventually(t, "the background settling finished", settled)
				close(f.yAnswer)
				l, err := receive(t, yErr)
				if err != nil || l.Token() != 9 {
					t.Fatalf("the waiting call: %v, %v; want the grant 9 the session holds", l, err)
				}
				f.mu.Lock()
				defer f.mu.Unlock()
				if !f.held[9] || slices.Contains(f.releases, 9) {
					t.Errorf("grant 9, left to the waiting call, was released (releases %v)", f.releases)
				}
				return
			}
			close(f.yAnswer)
			if _, err := receive(t, yErr); !errors.Is(err, ErrNotHeld) {
				t.Fatalf("the waiting call answered with the released grant 5: %v, want ErrNotHeld", err)
			}
			close(applyTarget)
			eventually(t, "the grant the caller did not get released", func() bool {
				f.mu.Lock()
				defer f.mu.Unlock()
				return !f.held[9]
			})
			eventually(t, "the background settling finished", settled)
			// The released mark outlives no call: none is in flight.
			eventually(t, "no acquire bookkeeping left", func() bool { return bookkeepingClear(s) })
			for _, l := range s.Locks() {
				t.Errorf("the session lists %s token %d", l.Name(), l.Token())
			}
		})
	}
}

// A call that stops waiting leaves the session's place to another waiting
// call, but that call's answer is of its own request, applied while the
// session held an earlier grant (released since): it returns ErrNotHeld.
// The place, queued by the first call's request, must not stay with no
// call in it (when granted, no call would learn of the grant): the last
// waiting call to end without a grant withdraws it.
func TestLastWaitingCallWithdrawsAPlaceLeftToIt(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	var (
		mu       sync.Mutex
		acquires int
		queued   bool
		lateSeq  uint64
		byName   int
	)
	yAnswer := make(chan struct{})
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		mu.Lock()
		switch {
		case req.GetOp() == lockpb.Op_OP_ACQUIRE && lateSeq != 0 && req.GetSeq() == lateSeq:
			q := queued
			mu.Unlock()
			if q {
				return &lockpb.Response{Code: lockpb.Code_CODE_OK, Queued: true}, nil
			}
			return &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}, nil
		case req.GetOp() == lockpb.Op_OP_ACQUIRE:
			acquires++
			switch acquires {
			case 1:
				mu.Unlock()
				return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 5}, nil
			case 2:
				mu.Unlock()
				<-yAnswer
				return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 5}, nil
			default:
				lateSeq = req.GetSeq()
				queued = true // behind another session, which took the freed lock
				mu.Unlock()
				<-ctx.Done()
				return nil, ctx.Err()
			}
		case req.GetOp() == lockpb.Op_OP_RELEASE:
			mu.Unlock()
			return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: req.GetToken()}, nil
		case req.GetOp() == lockpb.Op_OP_WITHDRAW:
			if req.GetName() != "" {
				byName++
				queued = false
			}
			mu.Unlock()
			return &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}, nil
		}
		mu.Unlock()
		return nil, errors.New("unexpected request")
	}
	be.mu.Unlock()
	ctx := context.Background()
	yErr := waiterBesideReleasedGrant(t, s, func() bool { mu.Lock(); defer mu.Unlock(); return acquires == 2 })
	zctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, zerr := s.Acquire(zctx, "x")
	cancel()
	if !errors.Is(zerr, context.DeadlineExceeded) {
		t.Fatalf("the call that left the place: %v", zerr)
	}
	close(yAnswer)
	if _, err := receive(t, yErr); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("the waiting call answered with the released grant: %v, want ErrNotHeld", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if queued || byName != 1 {
		t.Errorf("queued %v after %d withdrawals of the place: the session stays queued for x with no call waiting", queued, byName)
	}
}

// The place a call leaves to another waiting call can also outlive that
// call's success: the other call is granted and returns, its holder
// releases, and only then is the first call's request applied, queued
// behind another session. The call that left the place learns that from
// its recheck, finds no call waiting any more, and withdraws the place:
// at once, or in the background when its take-back was not answered in
// time (ErrWithdrawPending).
func TestLeftPlaceWithdrawnWhenItsWaitersAreGone(t *testing.T) {
	for _, background := range []bool{false, true} {
		t.Run(fmt.Sprint("background=", background), func(t *testing.T) {
			be, _, s := newLeaseHarness(t, true)
			var (
				mu        sync.Mutex
				acquires  int
				takeBacks int
				lateSeq   uint64
				queued    bool
				byName    int
			)
			yGo, yDone := make(chan struct{}), make(chan struct{})
			be.mu.Lock()
			be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
				mu.Lock()
				switch {
				case req.GetOp() == lockpb.Op_OP_ACQUIRE && lateSeq != 0 && req.GetSeq() == lateSeq:
					queued = true // applied after the release, behind another session
					mu.Unlock()
					return &lockpb.Response{Code: lockpb.Code_CODE_OK, Queued: true}, nil
				case req.GetOp() == lockpb.Op_OP_ACQUIRE:
					acquires++
					if acquires == 1 {
						mu.Unlock()
						<-yGo
						return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 7}, nil
					}
					lateSeq = req.GetSeq()
					mu.Unlock()
					<-ctx.Done()
					return nil, ctx.Err()
				case req.GetOp() == lockpb.Op_OP_RELEASE:
					mu.Unlock()
					return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: req.GetToken()}, nil
				case req.GetOp() == lockpb.Op_OP_WITHDRAW && req.GetName() == "":
					takeBacks++
					late := background && takeBacks == 1
					mu.Unlock()
					if late { // not answered in time
						<-ctx.Done()
						return nil, ctx.Err()
					}
					close(yGo) // the waiting call is granted, returns and releases
					<-yDone
					return &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}, nil
				case req.GetOp() == lockpb.Op_OP_WITHDRAW:
					byName++
					queued = false
					mu.Unlock()
					return &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}, nil
				}
				mu.Unlock()
				return nil, errors.New("unexpected request")
			}
			be.mu.Unlock()
			ctx := context.Background()
			yErr := make(chan error, 1)
			go func() {
				defer close(yDone)
				l, err := s.Acquire(ctx, "x")
				if err == nil {
					err = l.Release(ctx)
				}
				yErr <- err
			}()
			eventually(t, "the waiting call in flight", func() bool { mu.Lock(); defer mu.Unlock(); return acquires == 1 })
			zctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			_, err := s.Acquire(zctx, "x")
			cancel()
			want := context.DeadlineExceeded
			if background {
				want = ErrWithdrawPending
			}
			if !errors.Is(err, want) {
				t.Fatalf("the call that left the place: %v, want %v", err, want)
			}
			if err := <-yErr; err != nil {
				t.Fatalf("the waiting call: %v", err)
			}
			eventually(t, "the place withdrawn once", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return byName == 1 && !queued
			})
		})
	}
}
