package quorumlock_test

// Regression tests from review D (the background withdrawal of an
// interrupted Acquire, ErrWithdrawPending).

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

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
