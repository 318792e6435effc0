package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// Which tests run in parallel (t.Parallel, first statement; with go test's
// default -parallel, two at a time on CI's two cores, after every
// sequential test): those that take seconds mostly waiting (for a TTL, an
// election, a fault to pass) and assert outcomes that must hold under any
// scheduling. Tests stay sequential when they:
//   - measure time against a bound, or need a session with a short TTL
//     (a few seconds) to outlive a fault, which another cluster's load
//     could starve of heartbeats;
//   - need a leader that never changes or a log that does not move (or
//     skip when it does);
//   - count the process's goroutines (goleak, runtime.NumGoroutine) or
//     spin on every core;
//   - restart a replica: it listens again on its old address, which a
//     parallel test's listener on port 0 could have taken meanwhile.
//
// Each testcluster has a ClusterName of its own, so that a replica of one
// test's cluster can never be taken for a member of another's. On CI
// (2026-12-02) the package took 464 s instead of 562, and 583 s instead of
// 806 under -race (there also thanks to pebblestore's faster check of a
// WAL's tail).

// sameTermWindow runs window, which returns the leader's status at its
// start and at its end, until the term stays the same through one, at
// most rounds times (then it fails t), and returns that window's
// statuses. Tests that count the leader's commits over a window use it:
// an election inside the window appends its empty entry (the test
// cluster's election timeout is 100 ms, which a loaded race-detector run
// can miss), so a window in which the term moved says nothing either
// way. window gets the round's number, from 0.
func sameTermWindow(t *testing.T, rounds int, window func(round int) (start, end quorumlock.Status)) (start, end quorumlock.Status) {
	t.Helper()
	for round := range rounds {
		start, end = window(round)
		if end.Term == start.Term {
			return start, end
		}
		t.Logf("window %d: term %d -> %d: again", round, start.Term, end.Term)
	}
	t.Fatalf("the term moved in each of %d windows; last %d -> %d", rounds, start.Term, end.Term)
	return start, end
}

// testCtx returns a context bounded for one test step.
func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// where names o in failure messages: a replica by its ID, or a client.
func where(o opener) string {
	if n, ok := o.(*quorumlock.Node); ok {
		return fmt.Sprintf("replica %d", n.ID())
	}
	return "the client"
}

// newSession opens a session through o, a replica or a client.
func newSession(t *testing.T, o opener, opts ...quorumlock.SessionOption) *quorumlock.Session {
	t.Helper()
	s, err := o.NewSession(testCtx(t, 10*time.Second), opts...)
	if err != nil {
		t.Fatalf("NewSession on %s: %v", where(o), err)
	}
	return s
}

func mustAcquire(t *testing.T, s *quorumlock.Session, name string) *quorumlock.Lock {
	t.Helper()
	l, err := s.Acquire(testCtx(t, 10*time.Second), name)
	if err != nil {
		t.Fatalf("Acquire(%q) by session %d: %v", name, s.ID(), err)
	}
	return l
}

func holder(t *testing.T, o opener, name string) quorumlock.LockInfo {
	t.Helper()
	info, err := o.Holder(testCtx(t, 10*time.Second), name)
	if err != nil {
		t.Fatalf("Holder(%q) on %s: %v", name, where(o), err)
	}
	return info
}

// waitQueued waits until session is among the waiters of name, as read
// through o.
func waitQueued(t *testing.T, o opener, name string, session uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if slices.Contains(holder(t, o, name).Waiters, session) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("session %d never queued for %q", session, name)
}

// waitFree waits up to within until name has neither holder nor waiters,
// as read through o, and returns whether it got there (the last reading
// in info).
func waitFree(t *testing.T, o opener, name string, within time.Duration) (info quorumlock.LockInfo, free bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		info = holder(t, o, name)
		if info.Holder == 0 && len(info.Waiters) == 0 {
			return info, true
		}
		if time.Now().After(deadline) {
			return info, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type acquireResult struct {
	l   *quorumlock.Lock
	err error
}

// acquireAsync runs s.Acquire(ctx, name) in the background.
func acquireAsync(ctx context.Context, s *quorumlock.Session, name string) <-chan acquireResult {
	ch := make(chan acquireResult, 1)
	go func() {
		l, err := s.Acquire(ctx, name)
		ch <- acquireResult{l, err}
	}()
	return ch
}

// acquireQueued runs s.Acquire(ctx, name) in the background and waits
// until s is queued for name, as read through o.
func acquireQueued(t *testing.T, ctx context.Context, s *quorumlock.Session, o opener, name string) <-chan acquireResult {
	t.Helper()
	ch := acquireAsync(ctx, s, name)
	waitQueued(t, o, name, s.ID())
	return ch
}

// checkLockCallsRefuseName checks that Acquire and TryAcquire on s, and
// Holder through o, refuse name with ErrInvalidName.
func checkLockCallsRefuseName(t *testing.T, ctx context.Context, s *quorumlock.Session, o opener, name string) {
	t.Helper()
	if _, err := s.Acquire(ctx, name); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("Acquire(%q): %v", name, err)
	}
	if _, err := s.TryAcquire(ctx, name); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("TryAcquire(%q): %v", name, err)
	}
	if _, err := o.Holder(ctx, name); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("Holder(%q): %v", name, err)
	}
}

// follower returns a running replica that is not the leader.
func follower(c *testcluster.Cluster, leader uint64, skip ...uint64) uint64 {
	for _, id := range c.Running() {
		if id != leader && !slices.Contains(skip, id) {
			return id
		}
	}
	return 0
}

// cutOffChecker stops every replica of c but x (invariant 12's cluster
// without a quorum) and returns checkWithinCtx with a 300 ms budget and
// 500 ms slack, for the calls to run on x.
func cutOffChecker(t *testing.T, c *testcluster.Cluster, x uint64) func(what string, call func(ctx context.Context) error, want ...error) {
	for _, id := range c.IDs() {
		if id != x {
			c.Stop(id)
		}
	}
	return func(what string, call func(ctx context.Context) error, want ...error) {
		t.Helper()
		checkWithinCtx(t, what, 300*time.Millisecond, 500*time.Millisecond, call, want...)
	}
}

// checkWithinCtx runs call with a context of budget and fails t unless
// it returns within budget+slack with an error matching one of want. The
// call runs apart so that one ignoring its ctx fails the test instead of
// hanging it.
func checkWithinCtx(t *testing.T, what string, budget, slack time.Duration, call func(ctx context.Context) error, want ...error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- call(ctx) }()
	var err error
	select {
	case err = <-errc:
	case <-time.After(budget + slack + 5*time.Second):
		t.Errorf("%s still running %v after its %v context ended", what, time.Since(start), budget)
		return
	}
	if took := time.Since(start); took > budget+slack {
		t.Errorf("%s took %v with a %v context", what, took, budget)
	}
	for _, w := range want {
		if errors.Is(err, w) {
			return
		}
	}
	t.Errorf("%s: %v, want one of %v", what, err, want)
}

// observeEnds reads ch, an Observe stream, until it closes, and reports
// whether it closed within d.
func observeEnds(ch <-chan quorumlock.LeaderInfo, d time.Duration) bool {
	timeout := time.After(d)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return true
			}
		case <-timeout:
			return false
		}
	}
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// silentListener returns a loopback listener that accepts connections and
// never answers on them (a paused process's port); it and its connections
// are closed when the test ends.
func silentListener(t *testing.T) net.Listener {
	t.Helper()
	lis := mustListen(t)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return lis
}

// deadAddr returns a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis := mustListen(t)
	addr := lis.Addr().String()
	lis.Close()
	return addr
}
