package quorumlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// fakeBackend answers every proposal OK and heartbeats as told; it records
// the manual-clock time of every heartbeat.
type fakeBackend struct {
	clk *clock.Manual

	mu     sync.Mutex
	ack    bool
	sent   []time.Time
	block  chan struct{} // if set, keepAlive waits for it before answering
	nextID uint64
	hang   bool // propose never answers: it returns when ctx ends
	hung   int  // proposals hanging now
	// handle, if set, answers every proposal (called without f.mu held).
	handle func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error)
}

func (f *fakeBackend) propose(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
	f.mu.Lock()
	if h := f.handle; h != nil {
		f.mu.Unlock()
		return h(ctx, req)
	}
	defer f.mu.Unlock()
	if f.hang {
		f.hung++
		f.mu.Unlock()
		<-ctx.Done()
		f.mu.Lock()
		f.hung--
		return nil, ctx.Err()
	}
	f.nextID++
	return &lockpb.Response{Code: lockpb.Code_CODE_OK, Session: 100 + f.nextID, Token: f.nextID}, nil
}

func (f *fakeBackend) keepAlive(ctx context.Context, ids []uint64) ([]uint64, []uint64, error) {
	f.mu.Lock()
	f.sent = append(f.sent, f.clk.Now())
	ack, block := f.ack, f.block
	f.mu.Unlock()
	if block != nil {
		<-block
	}
	if !ack {
		return nil, nil, errNoLeader
	}
	return ids, nil, nil
}

func (f *fakeBackend) settleGrace() time.Duration { return 100 * time.Millisecond }

func (f *fakeBackend) heartbeats() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sent)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// settle waits until the heartbeater and the lease timer are armed (two
// pending waiters on the manual clock), so an Advance cannot slip in between
// a loop's reading of the clock and its arming of the next wake-up.
func settle(t *testing.T, clk *clock.Manual, want int) {
	t.Helper()
	eventually(t, "timers armed", func() bool { return clk.Pending() >= want })
	time.Sleep(2 * time.Millisecond)
}

// answerWhen answers resp once gate is closed (a leader with a quorum
// answers), or ends with ctx's error if ctx ends first: a fake backend's
// handling of a request that needs the cluster.
func answerWhen(ctx context.Context, gate <-chan struct{}, resp *lockpb.Response) (*lockpb.Response, error) {
	select {
	case <-gate:
		return resp, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func newLeaseHarness(t *testing.T, ack bool) (*fakeBackend, *clock.Manual, *Session) {
	clk := clock.NewManual(time.Unix(5000, 0))
	be := &fakeBackend{clk: clk, ack: ack}
	closed := make(chan struct{})
	hb := newHeartbeater(be, clk, closed)
	hb.start()
	t.Cleanup(func() { close(closed); hb.wait() })
	s, err := openSession(context.Background(), be, newOpenCalls(), hb, clk, 3*time.Second, 256)
	if err != nil {
		t.Fatal(err)
	}
	return be, clk, s
}

// Invariant 5: the belief ends at send time of the last acknowledged
// heartbeat + TTL - margin; then Done and Lost close and calls fail.
func TestLeaseEndsAtSendTimePlusTTLMinusMargin(t *testing.T) {
	be, clk, s := newLeaseHarness(t, true)
	opened := clk.Now()
	if want := opened.Add(3*time.Second - 300*time.Millisecond); !s.Deadline().Equal(want) {
		t.Fatalf("initial deadline %v, want %v", s.Deadline(), want)
	}
	l, err := s.Acquire(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	settle(t, clk, 2)
	clk.Advance(time.Second) // TTL/3: first heartbeat, acknowledged
	eventually(t, "renewal", func() bool { return s.Deadline().Equal(opened.Add(time.Second + 2700*time.Millisecond)) })
	if be.heartbeats() != 1 {
		t.Fatalf("%d heartbeats at TTL/3", be.heartbeats())
	}

	// From now on nothing is acknowledged.
	be.mu.Lock()
	be.ack = false
	be.mu.Unlock()
	lastAck := opened.Add(time.Second)
	settle(t, clk, 2)
	clk.Advance(2699 * time.Millisecond) // one ms before the deadline
	time.Sleep(10 * time.Millisecond)
	if isDone(s.Done()) {
		t.Fatal("session ended before its deadline")
	}
	settle(t, clk, 2)
	clk.Advance(time.Millisecond)
	eventually(t, "lease end", func() bool { return isDone(s.Done()) && isDone(l.Lost()) })
	if !s.Deadline().Equal(lastAck.Add(2700 * time.Millisecond)) {
		t.Fatalf("deadline %v", s.Deadline())
	}
	if !errors.Is(s.Err(), ErrSessionExpired) {
		t.Fatalf("Err %v", s.Err())
	}
	if _, err := s.Acquire(context.Background(), "y"); !errors.Is(err, ErrSessionExpired) {
		t.Fatalf("Acquire after the lease: %v", err)
	}
	// An expired session is never renewed, not even by a late ack.
	s.renewed(clk.Now())
	if !errors.Is(s.Err(), ErrSessionExpired) || s.Deadline().After(lastAck.Add(2700*time.Millisecond)) {
		t.Fatal("a late acknowledgement resurrected the session")
	}
}

// A call in flight when the session ends locally returns the end cause
// at once, whatever its own context: here an Acquire without a deadline
// whose request is never answered, when the lease runs out.
func TestSessionEndCancelsCallsInFlight(t *testing.T) {
	be, clk, s := newLeaseHarness(t, false)
	be.mu.Lock()
	be.hang = true
	be.mu.Unlock()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Acquire(context.Background(), "x")
		errc <- err
	}()
	eventually(t, "the acquire in flight", func() bool {
		be.mu.Lock()
		defer be.mu.Unlock()
		return be.hung == 1
	})
	settle(t, clk, 2)
	clk.Advance(3 * time.Second) // past TTL - margin, no heartbeat acknowledged
	select {
	case err := <-errc:
		if !errors.Is(err, ErrSessionExpired) {
			t.Fatalf("Acquire in flight when the lease ran out: %v, want ErrSessionExpired", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an Acquire in flight outlived its session")
	}
}

// The lease is extended from the send time, not the time the answer came
// back: a slow acknowledgement buys nothing.
func TestLeaseCountsFromSendTime(t *testing.T) {
	be, clk, s := newLeaseHarness(t, true)
	block := make(chan struct{})
	be.mu.Lock()
	be.block = block
	be.mu.Unlock()
	settle(t, clk, 2)
	clk.Advance(time.Second)
	t.Cleanup(func() { close(block) })
	eventually(t, "heartbeat sent", func() bool { return be.heartbeats() == 1 })
	sent := clk.Now()
	be.mu.Lock()
	be.ack, be.block = false, nil // later heartbeats fail
	be.mu.Unlock()
	settle(t, clk, 1)                    // the lease timer; no heartbeat is due while one is in flight
	clk.Advance(1500 * time.Millisecond) // the answer is slow
	block <- struct{}{}
	eventually(t, "renewal", func() bool { return s.Deadline().Equal(sent.Add(2700 * time.Millisecond)) })
}

// Invariant 5: an acknowledgement that arrives after the lease ran out,
// before the lease timer has fired, does not renew it: Deadline stays in
// the past and the session ends then, as the timer would end it.
func TestLateAckBeforeLeaseTimerDoesNotRenew(t *testing.T) {
	_, clk, s := newLeaseHarness(t, false)
	deadline := s.Deadline()
	sent := deadline.Add(-time.Second) // a heartbeat sent before the deadline
	s.mu.Lock()
	s.timer.Stop() // hold the lease timer back, as a busy runtime may
	s.mu.Unlock()
	clk.Advance(deadline.Sub(clk.Now()))
	s.renewed(sent)
	if got := s.Deadline(); !got.Equal(deadline) {
		t.Fatalf("a late acknowledgement moved the deadline from %v to %v", deadline, got)
	}
	if !isDone(s.Done()) || !errors.Is(s.Err(), ErrSessionExpired) {
		t.Fatalf("the late acknowledgement left the session alive: %v", s.Err())
	}
}

// Whoever sees a session's Done closed sees every one of its locks' Lost
// closed too: end closes the Lost channels first. A watcher woken by Done
// checks the channels of many locks while end would still be closing them
// if the order were the other way round.
func TestLostClosedBeforeDone(t *testing.T) {
	_, clk, s := newLeaseHarness(t, false)
	const n = 5000
	lost := make([]<-chan struct{}, n)
	for i := range n {
		l, err := s.Acquire(context.Background(), fmt.Sprintf("l%04d", i))
		if err != nil {
			t.Fatal(err)
		}
		lost[i] = l.Lost()
	}
	open := make(chan int, 1)
	watching := make(chan struct{})
	go func() {
		close(watching)
		<-s.Done()
		still := 0
		for _, c := range lost {
			if !isDone(c) {
				still++
			}
		}
		open <- still
	}()
	<-watching
	settle(t, clk, 2)
	clk.Advance(3 * time.Second) // past the lease: no heartbeat is acknowledged
	select {
	case still := <-open:
		if still != 0 {
			t.Fatalf("%d of %d locks' Lost still open when Done closed", still, n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not end at its lease")
	}
	if !errors.Is(s.Err(), ErrSessionExpired) {
		t.Fatalf("Err %v, want ErrSessionExpired", s.Err())
	}
}
