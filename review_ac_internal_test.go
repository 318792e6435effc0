package quorumlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// Review AC (mutation sweep of invariants 1-6): invariant 5, the client's
// lease.

// TestReviewACDoneAndErrAloneEndTheBelief checks that Done and Err each,
// called first (no Lost before them), report the session over once the
// clock is past the deadline while the lease timer is late.
// TestReviewOLateLeaseTimerStillEndsTheBelief calls Lost first, which
// ended the session for the others.
func TestReviewACDoneAndErrAloneEndTheBelief(t *testing.T) {
	for _, first := range []string{"Done", "Err"} {
		t.Run(first, func(t *testing.T) {
			_, clk, s := newLeaseHarness(t, false)
			s.mu.Lock()
			s.timer.Stop() // the lease timer is late
			s.mu.Unlock()
			clk.Advance(s.Deadline().Sub(clk.Now()))
			switch first {
			case "Done":
				if !isDone(s.Done()) {
					t.Fatal("Done open past the deadline")
				}
			case "Err":
				if err := s.Err(); !errors.Is(err, ErrSessionExpired) {
					t.Fatalf("Err past the deadline: %v, want ErrSessionExpired", err)
				}
			}
		})
	}
}

// TestReviewACLeaseTimerClosesChannels checks that the lease timer itself
// ends the belief at the deadline: Done and Lost channels taken before it
// close when the clock reaches the deadline, with no call that would check
// the lease on the way.
func TestReviewACLeaseTimerClosesChannels(t *testing.T) {
	_, clk, s := newLeaseHarness(t, false)
	l, err := s.Acquire(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	done, lost := s.Done(), l.Lost()
	settle(t, clk, 2)
	clk.Advance(s.Deadline().Sub(clk.Now()))
	eventually(t, "Done and Lost closed at the deadline", func() bool {
		return isDone(done) && isDone(lost)
	})
}

// TestReviewACOpenLeaseFromSendTime checks that a session's first lease
// counts from when its open was sent, not from when the answer came: the
// leader's timer may start on apply, before the answer reaches the client.
func TestReviewACOpenLeaseFromSendTime(t *testing.T) {
	clk := clock.NewManual(time.Unix(5000, 0))
	be := &fakeBackend{clk: clk}
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		clk.Advance(time.Second) // the answer is slow
		return &lockpb.Response{Code: lockpb.Code_CODE_OK, Session: 7}, nil
	}
	stop := make(chan struct{})
	hb := newHeartbeater(be, clk, stop)
	hb.start()
	t.Cleanup(func() { close(stop); hb.wait() })
	sent := clk.Now()
	s, err := openSession(context.Background(), be, newOpenCalls(), hb, clk, 3*time.Second, 256)
	if err != nil {
		t.Fatal(err)
	}
	if want := sent.Add(3*time.Second - leaseMargin(3*time.Second)); !s.Deadline().Equal(want) {
		t.Fatalf("deadline %v, want send time + TTL - margin = %v", s.Deadline(), want)
	}
}

// goneBackend answers every heartbeat "gone": the cluster ended the
// session (expired or revoked it).
type goneBackend struct{ *fakeBackend }

func (g goneBackend) keepAlive(ctx context.Context, ids []uint64) ([]uint64, []uint64, error) {
	g.fakeBackend.mu.Lock()
	g.fakeBackend.sent = append(g.fakeBackend.sent, g.clk.Now())
	g.fakeBackend.mu.Unlock()
	return nil, ids, nil
}

// TestReviewACGoneEndsSessionAtOnce checks that a heartbeat answered
// "gone" ends the session at once (Lost and Done closed,
// ErrSessionExpired), not at its deadline: the cluster may have granted
// its locks to others already.
func TestReviewACGoneEndsSessionAtOnce(t *testing.T) {
	clk := clock.NewManual(time.Unix(5000, 0))
	be := goneBackend{&fakeBackend{clk: clk}}
	stop := make(chan struct{})
	hb := newHeartbeater(be, clk, stop)
	hb.start()
	t.Cleanup(func() { close(stop); hb.wait() })
	s, err := openSession(context.Background(), be, newOpenCalls(), hb, clk, 3*time.Second, 256)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	lost := l.Lost()
	settle(t, clk, 2)
	clk.Advance(time.Second) // TTL/3: the first heartbeat, answered gone
	eventually(t, "the heartbeat", func() bool { return be.heartbeats() >= 1 })
	eventually(t, "Lost closed after gone", func() bool { return isDone(lost) })
	if clk.Now().After(s.Deadline()) || !isDone(s.Done()) || !errors.Is(s.Err(), ErrSessionExpired) {
		t.Fatalf("after gone: now %v deadline %v, Err %v", clk.Now(), s.Deadline(), s.Err())
	}
}
