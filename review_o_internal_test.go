package quorumlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// Invariant 5 with a late lease timer (a busy runtime, a process that was
// paused): once the client's clock is past the deadline, Lost, Done, Err
// and the calls report the session over, whether or not the timer has
// fired yet. They used to vouch for the lease until the timer ran: a
// holder polling Lost before touching the resource went on past its
// deadline.
func TestReviewOLateLeaseTimerStillEndsTheBelief(t *testing.T) {
	_, clk, s := newLeaseHarness(t, false)
	l, err := s.Acquire(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	ld, err := s.Elect(context.Background(), "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.timer.Stop() // the lease timer is late
	s.mu.Unlock()
	clk.Advance(s.Deadline().Sub(clk.Now()))
	if !isDone(l.Lost()) {
		t.Fatal("Lost open past the deadline")
	}
	if !isDone(s.Done()) || !errors.Is(s.Err(), ErrSessionExpired) {
		t.Fatalf("session alive past the deadline: %v", s.Err())
	}
	if !isDone(ld.Done()) || ld.Context().Err() == nil {
		t.Fatal("leadership alive past the deadline")
	}
	if _, err := s.Acquire(context.Background(), "y"); !errors.Is(err, ErrSessionExpired) {
		t.Fatalf("Acquire past the deadline: %v", err)
	}
}

// A grant answered after the deadline, with the lease timer late, is not
// returned: the Lock would have an open Lost with the lease over.
func TestReviewOGrantAfterDeadlineWithLateTimer(t *testing.T) {
	be, clk, s := newLeaseHarness(t, false)
	gate := make(chan struct{})
	sent := make(chan struct{}, 1)
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		sent <- struct{}{}
		return answerWhen(ctx, gate, &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 42})
	}
	be.mu.Unlock()
	type result struct {
		l   *Lock
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := s.Acquire(context.Background(), "x")
		done <- result{l, err}
	}()
	<-sent // the acquire is in flight
	s.mu.Lock()
	s.timer.Stop()
	s.mu.Unlock()
	clk.Advance(s.Deadline().Sub(clk.Now()))
	close(gate)
	select {
	case r := <-done:
		if !errors.Is(r.err, ErrSessionExpired) {
			lost := r.l != nil && isDone(r.l.lost)
			t.Fatalf("Acquire answered past the deadline: %v, %v (Lost closed: %v)", r.l, r.err, lost)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not return")
	}
}
