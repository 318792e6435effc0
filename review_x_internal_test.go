package quorumlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// Review X: openSession's bookkeeping of its call in openCalls.

// A NewSession call is forgotten by openCalls once it returns a session:
// without that, every call of a long-lived Client or Node would stay in
// openCalls.calls, and the late answers of its abandoned attempts with it.
func TestReviewXOpenCallForgottenOnSuccess(t *testing.T) {
	clk := clock.NewManual(time.Unix(1000, 0))
	be := &fakeBackend{clk: clk, ack: true}
	hb := newHeartbeater(be, clk, make(chan struct{}))
	opens := newOpenCalls()
	for range 3 {
		s, err := openSession(context.Background(), be, opens, hb, clk, 10*time.Second, 64)
		if err != nil {
			t.Fatal(err)
		}
		s.end(ErrClosed, false)
	}
	opens.mu.Lock()
	n := len(opens.calls)
	opens.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d calls left in openCalls after three successful opens", n)
	}
}

// A call answered with a refusal (here CODE_LIMIT) failed: the session
// that a late answer of one of its abandoned attempts named has no taker,
// and is closed, as for a call whose ctx ended.
func TestReviewXLateOpenAnswerOfRefusedCallClosed(t *testing.T) {
	r := newReviewSStream(t)
	clk := clock.NewManual(time.Unix(1000, 0))
	be := &fakeBackend{clk: clk, ack: true}
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		a := r.abandonedOpen(req.GetOpenId())
		r.answer(a, 60)
		if got := r.closes(); len(got) != 0 {
			t.Errorf("closed %v while the call goes on", got)
		}
		return &lockpb.Response{Code: lockpb.Code_CODE_LIMIT}, nil
	}
	hb := newHeartbeater(be, clk, make(chan struct{}))
	if _, err := openSession(r.ctx, be, r.opens, hb, clk, 10*time.Second, 64); !errors.Is(err, ErrLimit) {
		t.Fatalf("open: %v, want ErrLimit", err)
	}
	if got := r.closes(); len(got) != 1 || got[0] != 60 {
		t.Fatalf("closed %v after the call was refused, want [60]", got)
	}
}

// An open's answer found unread in its channel as the caller gave up
// (propStream.abandon's second case) is a late answer like one that comes
// after the cancel: while the call goes on or once it succeeded, its
// session is not closed (another attempt of the call may hold it); once
// the call failed, it is.
func TestReviewXAnswerUnreadAtAbandonSpared(t *testing.T) {
	r := newReviewSStream(t)
	unread := func(openID, session uint64) {
		c := make(chan *lockpb.Response, 1)
		c <- &lockpb.Response{Code: lockpb.Code_CODE_OK, Session: session}
		// Call id 0 is no waiter's: the answer was delivered to c.
		r.ps.abandon(0, &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: 10_000, OpenId: openID}, c)
	}
	ok := r.opens.start()
	unread(ok, 70)
	if got := r.closes(); len(got) != 0 {
		t.Fatalf("closed %v while the call goes on", got)
	}
	r.opens.end(ok, true)
	unread(ok, 70)
	if got := r.closes(); len(got) != 0 {
		t.Fatalf("closed %v, the session the call received", got)
	}
	failed := r.opens.start()
	unread(failed, 71)
	r.opens.end(failed, false)
	if got := r.closes(); len(got) != 1 || got[0] != 71 {
		t.Fatalf("closed %v after the call failed, want [71]", got)
	}
}

// Failed calls are kept for the late answers of their attempts, but no
// more than maxAbandonedOpens of them: openCalls does not grow with every
// failed NewSession call of a long-lived Client or Node.
func TestReviewXFailedOpenCallsBounded(t *testing.T) {
	o := newOpenCalls()
	for range maxAbandonedOpens + 100 {
		o.end(o.start(), false)
	}
	o.mu.Lock()
	calls, order := len(o.calls), len(o.failedOrder)
	o.mu.Unlock()
	if calls > maxAbandonedOpens || order > maxAbandonedOpens {
		t.Fatalf("%d calls, %d failed in order after %d failed calls; want at most %d", calls, order, maxAbandonedOpens+100, maxAbandonedOpens)
	}
}
