package quorumlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/service"
)

// ops records the requests a handler saw, by op; a withdrawal without a
// name (it takes back its target request only) counts as takeBack.
type ops struct {
	mu   sync.Mutex
	seen map[lockpb.Op]int
}

const takeBack lockpb.Op = 1000

func (o *ops) add(req *lockpb.Request) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen == nil {
		o.seen = map[lockpb.Op]int{}
	}
	op := req.GetOp()
	if op == lockpb.Op_OP_WITHDRAW && req.GetName() == "" {
		op = takeBack
	}
	o.seen[op]++
}

func (o *ops) count(op lockpb.Op) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.seen[op]
}

// An Acquire of a lock the session holds, applied before a concurrent
// Release of that lock but answered after it, must not hand back the
// released grant as a held Lock: the cluster has freed it.
func TestAcquireAnsweredWithAReleasedGrant(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	ctx := context.Background()
	l1, err := s.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	tok := l1.Token()
	var seen ops
	answer := make(chan struct{})
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		seen.add(req)
		switch req.GetOp() {
		case lockpb.Op_OP_ACQUIRE: // "already held": the same grant
			<-answer
			return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: uint64(tok)}, nil
		case lockpb.Op_OP_RELEASE:
			return &lockpb.Response{Code: lockpb.Code_CODE_OK}, nil
		}
		return nil, errors.New("unexpected request")
	}
	be.mu.Unlock()
	errc := make(chan error, 1)
	go func() {
		l, err := s.Acquire(ctx, "x")
		if err == nil {
			err = errors.New("returned a Lock")
			if isDone(l.Lost()) {
				err = nil // a Lock already lost is honest too
			}
		}
		errc <- err
	}()
	eventually(t, "the acquire in flight", func() bool { return seen.count(lockpb.Op_OP_ACQUIRE) == 1 })
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	close(answer)
	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, ErrNotHeld) {
			t.Fatalf("Acquire answered with the released grant %d: %v, want ErrNotHeld", tok, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire never returned")
	}
	if ls := s.Locks(); len(ls) != 0 {
		t.Fatalf("the session lists %d locks after releasing its only grant", len(ls))
	}
}

// queuedBehindAnother makes be answer as a cluster where another session
// holds every lock: an acquire waits until *grant closes (then it is
// granted token 7) or its ctx ends, or, with NoWait (a recheck), is
// answered at once, queued until then; a withdrawal is answered
// withdrawn. seen records the requests.
func queuedBehindAnother(be *fakeBackend, seen *ops, grant *chan struct{}) {
	be.mu.Lock()
	defer be.mu.Unlock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		seen.add(req)
		switch req.GetOp() {
		case lockpb.Op_OP_ACQUIRE:
			be.mu.Lock()
			g := *grant
			be.mu.Unlock()
			if req.GetNoWait() {
				select {
				case <-g:
					return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 7}, nil
				default:
					return &lockpb.Response{Code: lockpb.Code_CODE_OK, Queued: true}, nil
				}
			}
			select {
			case <-g:
				return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 7}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		case lockpb.Op_OP_WITHDRAW:
			return &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}, nil
		}
		return nil, errors.New("unexpected request")
	}
}

// Two waiting Acquire calls of one session share its place in the lock's
// queue: when one stops waiting, it leaves the place to the other rather
// than withdrawing it (it takes back its own request only); so does a
// TryAcquire that stops waiting beside a waiting call. The last one to
// stop withdraws.
func TestConcurrentWaitsShareTheQueuePlace(t *testing.T) {
	for _, second := range []struct {
		name string
		call func(s *Session, ctx context.Context) error
	}{
		{"Acquire", func(s *Session, ctx context.Context) error { _, err := s.Acquire(ctx, "x"); return err }},
		{"TryAcquire", func(s *Session, ctx context.Context) error { _, err := s.TryAcquire(ctx, "x"); return err }},
	} {
		t.Run(second.name, func(t *testing.T) {
			be, _, s := newLeaseHarness(t, true)
			var seen ops
			grant := make(chan struct{})
			queuedBehindAnother(be, &seen, &grant)
			first := make(chan error, 1)
			go func() {
				l, err := s.Acquire(context.Background(), "x")
				if err == nil && l.Token() != 7 {
					err = errors.New("wrong grant")
				}
				first <- err
			}()
			eventually(t, "the first acquire in flight", func() bool { return seen.count(lockpb.Op_OP_ACQUIRE) == 1 })
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			err := second.call(s, ctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("the second call after its deadline: %v", err)
			}
			if n := seen.count(lockpb.Op_OP_WITHDRAW); n != 0 {
				t.Fatalf("the second call withdrew the place the first still waits in (%d withdrawals)", n)
			}
			if n := seen.count(takeBack); n != 1 {
				t.Fatalf("the second call took back its own request %d times, want 1", n)
			}
			close(grant)
			if err := <-first; err != nil {
				t.Fatalf("the first Acquire: %v", err)
			}

			// Alone, a call that stops waiting withdraws.
			be.mu.Lock()
			grant = make(chan struct{})
			be.mu.Unlock()
			ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if _, err := s.Acquire(ctx, "y"); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a lone Acquire after its deadline: %v", err)
			}
			if n := seen.count(lockpb.Op_OP_WITHDRAW); n != 1 {
				t.Fatalf("a lone Acquire that stopped waiting sent %d withdrawals, want 1", n)
			}
		})
	}
}

// A withdrawal the cluster refuses (a limit) leaves the session's place in
// the queue unknown: the session is abandoned rather than reporting the
// acquire withdrawn. A refused Release keeps the lock held: ErrLimit.
func TestRefusedWithdrawalAndRelease(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	l1, err := s.Acquire(context.Background(), "held")
	if err != nil {
		t.Fatal(err)
	}
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		switch req.GetOp() {
		case lockpb.Op_OP_ACQUIRE:
			<-ctx.Done()
			return nil, ctx.Err()
		case lockpb.Op_OP_RELEASE, lockpb.Op_OP_WITHDRAW:
			return &lockpb.Response{Code: lockpb.Code_CODE_LIMIT}, nil
		}
		return &lockpb.Response{Code: lockpb.Code_CODE_OK}, nil
	}
	be.mu.Unlock()
	if err := l1.Release(context.Background()); !errors.Is(err, ErrLimit) || !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("a refused Release: %v, want ErrLimit and ErrUnknownOutcome", err)
	}
	if isDone(l1.Lost()) || len(s.Locks()) != 1 {
		t.Fatal("a refused Release dropped the lock, which the cluster still holds")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = s.Acquire(ctx, "x")
	if !errors.Is(err, ErrSessionExpired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an Acquire whose withdrawal was refused: %v, want the deadline and ErrSessionExpired", err)
	}
	if !isDone(s.Done()) {
		t.Fatal("the session goes on after a refused withdrawal")
	}
}

// A TryAcquire of a lock that another call of the same session waits for
// finds the session queued (the cluster answers OK, queued, no token): the
// lock is another session's, ErrLocked, not a Lock with token 0.
func TestTryAcquireOfALockTheSessionWaitsFor(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		return &lockpb.Response{Code: lockpb.Code_CODE_OK, Queued: true}, nil
	}
	be.mu.Unlock()
	l, err := s.TryAcquire(context.Background(), "x")
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("TryAcquire answered queued: lock %v, error %v; want ErrLocked", l, err)
	}
	if len(s.Locks()) != 0 {
		t.Fatal("the session lists a lock it waits for")
	}
}

// Each request lists the session's other requests in flight, increasing,
// with done their lowest; a session with more than maxListed in flight
// sends done alone.
func TestNextSeqListsRequestsInFlight(t *testing.T) {
	_, _, s := newLeaseHarness(t, true)
	a, b := s.nextSeq(), s.nextSeq()
	s.finish(a.seq)
	c := s.nextSeq()
	if !c.listed || len(c.pending) != 1 || c.pending[0] != b.seq || c.done != b.seq {
		t.Fatalf("with %d in flight: %+v, want pending [%d] and done %d", b.seq, c, b.seq, b.seq)
	}
	s.finish(b.seq)
	s.finish(c.seq)
	d := s.nextSeq()
	if !d.listed || len(d.pending) != 0 || d.done != d.seq {
		t.Fatalf("alone: %+v", d)
	}
	for range maxListed - 1 {
		s.nextSeq()
	}
	full := s.nextSeq() // maxListed others in flight
	if !full.listed || len(full.pending) != maxListed || full.done != d.seq || !slices.IsSorted(full.pending) {
		t.Fatalf("with %d others in flight: listed %v, %d pending, done %d", maxListed, full.listed, len(full.pending), full.done)
	}
	over := s.nextSeq()
	if over.listed || over.pending != nil || over.done != d.seq {
		t.Fatalf("with %d others in flight: %+v, want done %d alone", maxListed+1, over, d.seq)
	}
	req := over.request(&lockpb.Request{Op: lockpb.Op_OP_RELEASE})
	if req.GetSeq() != over.seq || req.GetDone() != over.done || req.GetListed() {
		t.Fatalf("request %v from %+v", req, over)
	}
}

// While a call withdraws the session's place in a lock's queue by name, a
// new Acquire of that lock waits for the withdrawal before it sends its
// request: applied before it, the request would lose its place to the
// withdrawal and wait for a grant that never comes; applied after the
// withdrawal decision but counted as a waiter by the withdrawing call, it
// could be left queued with no call waiting (both found by a review).
// Here behind a real fsm: the new call is queued after the withdrawal and
// granted when the holder releases.
func TestNewAcquireWaitsForAWithdrawal(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	var mu sync.Mutex
	m := fsm.New(fsm.Limits{})
	var index uint64
	apply := func(c *fsm.Command) (fsm.Result, []fsm.Event) {
		mu.Lock()
		defer mu.Unlock()
		index++
		return m.Apply(index, 1, c)
	}
	r, _ := apply(&fsm.Command{Op: fsm.OpOpenSession, TTL: int64(time.Minute)})
	other := r.Session
	r, _ = apply(&fsm.Command{Op: fsm.OpOpenSession, TTL: int64(time.Minute)})
	sid := r.Session
	held, _ := apply(&fsm.Command{Op: fsm.OpAcquire, Session: other, Seq: 1, Name: "x"})
	var order []string // the session's requests, as applied
	gate := make(chan struct{})
	granted := make(chan uint64, 1)
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		if req.GetOp() == lockpb.Op_OP_WITHDRAW && req.GetName() != "" {
			<-gate // the withdrawal is slow to apply
		}
		res, _ := apply(toCommand(sid, req))
		mu.Lock()
		order = append(order, fmt.Sprintf("%v/%d", req.GetOp(), req.GetSeq()))
		mu.Unlock()
		if req.GetOp() == lockpb.Op_OP_ACQUIRE && res.Code == fsm.CodeQueued {
			select {
			case tok := <-granted:
				return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: tok}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return service.ResponseOf(res), nil
	}
	be.mu.Unlock()

	bctx, bcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer bcancel()
	berr := make(chan error, 1)
	go func() { _, err := s.Acquire(bctx, "x"); berr <- err }()
	eventually(t, "B's withdrawal sent", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		c := s.acquiring["x"]
		return c != nil && c.settlers == 1
	})
	aerr := make(chan error, 1)
	var alock *Lock
	go func() {
		l, err := s.Acquire(context.Background(), "x")
		alock = l
		aerr <- err
	}()
	time.Sleep(20 * time.Millisecond)
	mu.Lock()
	sent := len(order)
	mu.Unlock()
	if sent != 1 { // B's acquire only
		t.Fatalf("requests applied while B withdraws: %v", order)
	}
	close(gate)
	if err := <-berr; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("B: %v", err)
	}
	eventually(t, "A queued", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(m.Holder("x").Waiters, sid)
	})
	rel, ev := apply(&fsm.Command{Op: fsm.OpRelease, Session: other, Seq: 2, Name: "x", Token: held.Token})
	if rel.Code != fsm.CodeOK || len(ev) != 1 || ev[0].Session != sid {
		t.Fatalf("release: %+v %+v", rel, ev)
	}
	granted <- ev[0].Token
	if err := <-aerr; err != nil {
		t.Fatalf("A: %v (applied: %v)", err, order)
	}
	if alock.Token() != Token(ev[0].Token) || !hasLock(s, "x") {
		t.Fatalf("A holds token %d, the cluster granted %d", alock.Token(), ev[0].Token)
	}
}
