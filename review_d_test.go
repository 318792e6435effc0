package quorumlock_test

// Regression tests from review D (the background withdrawal of an
// interrupted Acquire, ErrWithdrawPending).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// roleWaiters returns the sessions queued for role, read through cl.
func roleWaiters(t *testing.T, cl *quorumlock.Client, role string) ([]uint64, bool) {
	t.Helper()
	ls, _, err := cl.Locks(testCtx(t, 5*time.Second), "", 1000)
	if err != nil {
		return nil, false
	}
	for _, l := range ls {
		if l.Role && l.Name == role {
			return l.Waiters, true
		}
	}
	return nil, true
}

// A Node.Elect (its session dedicated to the campaign) whose ctx ends
// while its replica cannot reach a leader returns ErrWithdrawPending, and
// its session, which has no other use, must still leave the role's queue
// once a leader can hear it: before the background withdrawal, the
// abandoned session was closed in the background; with it, electOwned's
// Close (bounded by an election timeout) failed, ended the session locally
// and left its candidacy on the cluster until the TTL ran out, where it
// could be elected and hold the role with nobody leading.
func TestReviewDOwnedElectWithdrawPendingLeavesTheQueue(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 30 * time.Second})
	lead := c.WaitLeader(10 * time.Second)
	b := follower(c, lead)
	ctx := testCtx(t, 60*time.Second)
	var addrs []string
	for _, id := range c.IDs() {
		if id != b {
			addrs = append(addrs, c.Peers()[id])
		}
	}
	cl, err := quorumlock.Dial(ctx, addrs, quorumlock.WithElectionTimeout(c.ElectionTimeout()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })

	ld, err := c.Node(lead).Elect(ctx, "r", []byte("L"))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	werr := make(chan error, 1)
	go func() {
		_, err := c.Node(b).Elect(wctx, "r", []byte("W"))
		werr <- err
	}()
	var w uint64
	deadline := time.Now().Add(10 * time.Second)
	for w == 0 {
		if ws, _ := roleWaiters(t, cl, "r"); len(ws) == 1 {
			w = ws[0]
		}
		if time.Now().After(deadline) {
			t.Fatal("the candidate never queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.Isolate(b)
	cancel()
	select {
	case err = <-werr:
	case <-time.After(10 * time.Second):
		t.Fatal("Elect did not return after its ctx ended")
	}
	if !errors.Is(err, quorumlock.ErrWithdrawPending) {
		t.Skipf("the withdrawal was answered (%v): nothing to check", err)
	}
	c.Heal()
	deadline = time.Now().Add(10 * time.Second)
	for {
		ws, ok := roleWaiters(t, cl, "r")
		if ok && !slices.Contains(ws, w) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the interrupted candidate's session %d still waits for the role 10 s after a leader could hear it (waiters %v)", w, ws)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// Client.Close while an interrupted Acquire's withdrawal goes on in the
// background (the client cut off from every replica) returns, and leaves
// no goroutine of the client behind.
func TestReviewDClientCloseWithWithdrawalPendingLeavesNoGoroutines(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	h := newSession(t, c.Node(lead))
	mustAcquire(t, h, "busy")
	time.Sleep(100 * time.Millisecond)
	ignore := goleak.IgnoreCurrent()

	const me = 100 // the client's end of its links
	cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithDialer(c.Net.Dialer(me)), quorumlock.WithSessionTTL(30*time.Second))
	ctx := testCtx(t, 20*time.Second)
	s, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Acquire(actx, "busy")
		errc <- err
	}()
	waitQueued(t, c.Node(lead), "busy", s.ID())
	c.Net.Isolate(me, c.IDs())
	cancel()
	select {
	case err = <-errc:
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return after its ctx ended")
	}
	if !errors.Is(err, quorumlock.ErrWithdrawPending) {
		t.Skipf("the withdrawal was answered (%v): nothing to check", err)
	}
	if s.Err() != nil {
		t.Fatalf("session ended: %v", s.Err())
	}
	closed := make(chan struct{})
	go func() {
		cl.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Client.Close hangs with a withdrawal pending")
	}
	if s.Err() == nil {
		t.Fatal("session alive after Client.Close")
	}
	c.Net.Heal()
	goleak.VerifyNone(t, ignore)
}

// Many calls interrupted during one leaderless window (here 600
// TryAcquires of distinct locks with a short ctx, through a replica cut
// off from the others) each leave a withdrawal going on in the background.
// Once a leader hears them they must all settle without costing the
// session: before, every background withdrawal was re-sent at once with
// the request list of the moment it was first sent, the cluster had to
// remember an outcome for each withdrawal and its target, and past its
// 1,024 remembered outcomes per session it refused the rest (ErrLimit),
// which abandoned the session and lost its lock.
func TestReviewDManyPendingWithdrawalsKeepTheSession(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 60 * time.Second})
	lead := c.WaitLeader(10 * time.Second)
	b := follower(c, lead)
	ctx := testCtx(t, 120*time.Second)
	s := newSession(t, c.Node(b))
	a := mustAcquire(t, s, "A")
	c.Isolate(b)
	const n = 600
	errs := make(chan error, n)
	for i := range n {
		go func() {
			tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			defer cancel()
			_, err := s.TryAcquire(tctx, fmt.Sprintf("k%d", i))
			errs <- err
		}()
	}
	pending := 0
	for range n {
		if err := <-errs; errors.Is(err, quorumlock.ErrWithdrawPending) {
			pending++
		} else if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("TryAcquire without a leader: %v", err)
		}
	}
	t.Logf("%d of %d withdrawals pending", pending, n)
	c.Heal()
	// A waiting Acquire of a name waits for its withdrawal: each gets
	// through once the withdrawal settled, and the session lives on. One
	// sent while most of the other withdrawals are still on their way back
	// (each with its target: two requests in flight) may find the session
	// past its 1,024 requests in flight and fail with ErrLimit, as the
	// README's limits table says: it is tried again once they drain.
	refused := 0
	for i := range n {
		actx := testCtx(t, 20*time.Second)
		l, err := s.Acquire(actx, fmt.Sprintf("k%d", i))
		for errors.Is(err, quorumlock.ErrLimit) && s.Err() == nil && actx.Err() == nil {
			refused++
			time.Sleep(10 * time.Millisecond)
			l, err = s.Acquire(actx, fmt.Sprintf("k%d", i))
		}
		if err != nil {
			t.Fatalf("Acquire k%d after the window: %v (session: %v)", i, err, s.Err())
		}
		if err := l.Release(testCtx(t, 10*time.Second)); err != nil {
			t.Fatalf("Release k%d: %v", i, err)
		}
	}
	t.Logf("%d acquires refused for the requests in flight, then granted", refused)
	if s.Err() != nil || closed(a.Lost()) {
		t.Fatalf("the session ended: %v", s.Err())
	}
	if info := holder(t, c.Node(lead), "A"); info.Holder != s.ID() || info.Token != a.Token() {
		t.Fatalf("A: %+v", info)
	}
}
