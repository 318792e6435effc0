package quorumlock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// TestReviewNCloseUnderLoadLeavesNoGoroutines: a client and every
// replica are closed while 200 sessions (half through the client, half
// through a follower) wait for held locks, try others, read holders and
// observe roles. Every call returns, and nothing of the cluster or the
// client is left running: no goroutine beyond those the test started
// with.
func TestReviewNCloseUnderLoadLeavesNoGoroutines(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(10 * time.Second)
	f := c.Node(follower(c, lead))
	cl, err := quorumlock.Dial(testCtx(t, 10*time.Second), addrsOf(c, c.IDs()...), quorumlock.WithElectionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 30*time.Second)
	h := newSession(t, c.Node(lead))
	for i := range 4 {
		mustAcquire(t, h, fmt.Sprint("busy/", i))
	}
	openers := []opener{cl, f}
	var wg sync.WaitGroup
	for i := range 200 {
		o := openers[i%2]
		s, err := o.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for j := 0; ctx.Err() == nil && s.Err() == nil; j++ {
				switch j % 4 {
				case 0:
					s.Acquire(ctx, fmt.Sprint("busy/", i%4))
				case 1:
					if l, err := s.TryAcquire(ctx, fmt.Sprint("free/", i, "/", j)); err == nil {
						l.Release(ctx)
					}
				case 2:
					o.Holder(ctx, "busy/0")
				case 3:
					octx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
					for range o.Observe(octx, "role") {
					}
					cancel()
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	var closing sync.WaitGroup
	closing.Go(func() { cl.Close() })
	for _, id := range c.IDs() {
		closing.Go(func() { c.Node(id).Close() })
	}
	done := make(chan struct{})
	go func() { closing.Wait(); wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Close under load, or the calls it should end, did not return within 20 s")
	}
	goleak.VerifyNone(t, ignore)
}
