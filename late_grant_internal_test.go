package quorumlock

// A late answer to an acquire must not disturb the session's current
// grant of the name (found by a review of Session.granted).

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// gateBackend passes requests to a real replica's router, except that it
// can hold back the answer of the next acquire (as a slow network or a
// retry after a leader change does) and lose the answer of the next release
// (the release is applied; the caller's ctx ends first).
type gateBackend struct {
	backend

	mu           sync.Mutex
	holdAcquire  bool
	heldAnswered chan struct{} // closed when the held acquire has its answer
	letGo        chan struct{} // closed by the test: deliver it
	loseRelease  bool
}

func (g *gateBackend) propose(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
	g.mu.Lock()
	hold := g.holdAcquire && req.GetOp() == lockpb.Op_OP_ACQUIRE
	if hold {
		g.holdAcquire = false
	}
	lose := g.loseRelease && req.GetOp() == lockpb.Op_OP_RELEASE
	if lose {
		g.loseRelease = false
	}
	g.mu.Unlock()
	switch {
	case hold:
		resp, err := g.backend.propose(ctx, req)
		close(g.heldAnswered)
		<-g.letGo
		return resp, err
	case lose:
		if _, err := g.backend.propose(context.WithoutCancel(ctx), req); err != nil {
			return nil, err
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return g.backend.propose(ctx, req)
}

// A late answer to an acquire, carrying an older grant of the name, must
// not mark the session's current (newer) Lock of that name lost, nor come
// back as a held Lock: the session holds one grant of a name at a time, so
// a grant older than the one it holds is gone.
//
// Sequence (one session, lock "x"): acquire A is granted T1, its answer is
// held back; a reentrant acquire B returns the same grant (l1); l1's
// release is applied but its answer is lost (ErrUnknownOutcome, l1 stays
// listed); acquire C is granted T2 (l2, which replaces l1: correct); then
// A's answer (T1) arrives.
func TestReview2LateOlderGrantDoesNotLoseNewerLock(t *testing.T) {
	n, _ := startOne(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g := &gateBackend{backend: n.router, heldAnswered: make(chan struct{}), letGo: make(chan struct{})}
	s, err := openSession(ctx, g, newOpenCalls(), n.hb, n.cfg.Clock, 3*time.Second, n.cfg.MaxNameBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())

	g.mu.Lock()
	g.holdAcquire = true
	g.mu.Unlock()
	type result struct {
		l   *Lock
		err error
	}
	aDone := make(chan result, 1)
	go func() {
		l, err := s.Acquire(ctx, "x")
		aDone <- result{l, err}
	}()
	select {
	case <-g.heldAnswered:
	case <-ctx.Done():
		t.Fatal("acquire A never answered")
	}
	l1, err := s.Acquire(ctx, "x") // B: the session holds x: same grant
	if err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.loseRelease = true
	g.mu.Unlock()
	rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = l1.Release(rctx)
	rcancel()
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("release with a lost answer: %v, want ErrUnknownOutcome", err)
	}
	l2, err := s.Acquire(ctx, "x") // C: the release was applied: a new grant
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= l1.Token() {
		t.Fatalf("C got token %d, not above l1's %d", l2.Token(), l1.Token())
	}
	close(g.letGo) // A's answer (l1's token) arrives now
	var a result
	select {
	case a = <-aDone:
	case <-ctx.Done():
		t.Fatal("acquire A never returned")
	}
	info, err := n.Holder(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if info.Holder != s.ID() || info.Token != l2.Token() {
		t.Fatalf("holder %d token %d, want session %d token %d", info.Holder, info.Token, s.ID(), l2.Token())
	}
	var errs []string
	if isDone(l2.Lost()) {
		errs = append(errs, "l2 (the current grant) was marked lost by a late answer carrying an older token")
	}
	if a.err == nil && a.l.Token() != l2.Token() {
		errs = append(errs, "acquire A returned a Lock with a released token as held")
	}
	if ls := s.Locks(); len(ls) != 1 || ls[0].Token() != l2.Token() {
		errs = append(errs, "Session.Locks does not list the current grant")
	}
	for _, e := range errs {
		t.Error(e)
	}
	if len(errs) > 0 {
		t.Logf("l1 token %d, l2 token %d (cluster holder token %d); A returned lock=%v err=%v", l1.Token(), l2.Token(), info.Token, tokenOf(a.l), a.err)
	}
}

func tokenOf(l *Lock) any {
	if l == nil {
		return nil
	}
	return l.Token()
}
