package raftnode

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// TestReviewNAbandonedReadsAreDropped: a replica cut off from the others
// finds no leader, so its ReadIndex rounds go unanswered and are retried
// every election timeout. A read whose caller gave up (its ctx ended) must
// be dropped then, not carried into every later round: before the fix,
// each of thousands of timed-out calls stayed in the node's rounds for as
// long as the partition lasted. Once the partition heals, reads are
// answered again.
func TestReviewNAbandonedReadsAreDropped(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	x := c.others(lead)[0]
	n := c.nodes[x]
	c.isolate(x)
	c.tickUntil("the isolated member to lose its leader", func() bool { return n.Status().Leader == 0 })

	const calls = 2000
	reqs := make([]*readRequest, calls)
	var wg sync.WaitGroup
	for i := range reqs {
		reqs[i] = &readRequest{done: make(chan struct{})}
		base, cancel := context.WithCancel(context.Background())
		ctx := &secondDone{Context: base, waiting: make(chan struct{})}
		wg.Go(func() {
			if _, err := n.readIndex(ctx, reqs[i]); !errors.Is(err, context.Canceled) {
				t.Errorf("ReadIndex on a leaderless member = %v, want context.Canceled", err)
			}
		})
		// Cancel once the request is queued to the node.
		<-ctx.waiting
		cancel()
	}
	wg.Wait()
	for range 3 * electionTicks {
		c.clk.tick()
	}
	kept := 0
	for _, r := range reqs {
		select {
		case <-r.done:
		default:
			kept++
		}
	}
	if kept > 0 {
		t.Fatalf("%d of %d abandoned reads still kept after %d election timeouts without a leader", kept, calls, 3)
	}

	c.heal()
	c.tickUntil("the member to find the leader", func() bool { return n.Status().Leader != 0 })
	stop := c.tickInBackground()
	defer stop()
	if _, err := n.ReadIndex(testCtx(t)); err != nil {
		t.Fatalf("ReadIndex after the partition healed: %v", err)
	}
}

// secondDone is a ctx that closes waiting at the second call of Done: in
// ReadIndex, once the request was handed to the node (the first select
// took the send) and the caller waits for the answer.
type secondDone struct {
	context.Context
	calls   atomic.Int32
	waiting chan struct{}
}

func (c *secondDone) Done() <-chan struct{} {
	if c.calls.Add(1) == 2 {
		close(c.waiting)
	}
	return c.Context.Done()
}
