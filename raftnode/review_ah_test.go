package raftnode

import (
	"sync"
	"sync/atomic"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestReviewAHLateReadAnswerCounts: a follower's ReadIndex round whose
// answer comes back after more than an election timeout (a slow link to
// the leader: the round trip is longer than the timeout, but nothing is
// lost) is still answered by it. Before the fix, a round unanswered for an
// election timeout was replaced by a new one under a new context and the
// late answer to the first was ignored; with every answer that slow, each
// round was replaced before its answer came and the follower's reads never
// returned (seen with testcluster's Delay of 150 ms and a 100 ms election
// timeout: Holder on that follower blocked until its ctx ended).
func TestReviewAHLateReadAnswerCounts(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	f := c.others(lead)[0]

	// Hold back every read answer to f.
	var mu sync.Mutex
	var held []*raftpb.Message
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		if m.GetTo() == f && m.GetType() == raftpb.MsgReadIndexResp {
			mu.Lock()
			held = append(held, m)
			mu.Unlock()
			return false
		}
		return true
	})
	heldCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(held)
	}

	var answered atomic.Bool
	var readErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, readErr = c.nodes[f].ReadIndex(testCtx(t))
		answered.Store(true)
	}()
	c.waitFor("the read's first answer (held back)", func() bool { return heldCount() >= 1 })
	// More than an election timeout passes: f sends the round again.
	c.tickUntil("the round to be sent again", func() bool { return heldCount() >= 2 })
	if answered.Load() {
		t.Fatal("the read was answered while every answer was held back")
	}

	// The first answer arrives now, late; later ones stay held.
	mu.Lock()
	first := held[0]
	mu.Unlock()
	c.deliver(first)
	c.waitFor("the late answer to answer the read", answered.Load)
	<-done
	if readErr != nil {
		t.Fatalf("ReadIndex: %v", readErr)
	}
}

// TestReviewAHTimedOutRoundsShareOneRetry: rounds that time out together
// go on in one new round (one read index message per election timeout),
// not one each, while the retired rounds stay answerable: with many
// readers waiting on a slow or leaderless replica, retries do not
// multiply.
func TestReviewAHTimedOutRoundsShareOneRetry(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	f := c.others(lead)[0]

	var mu sync.Mutex
	var sent int // MsgReadIndex from f
	var held []*raftpb.Message
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		mu.Lock()
		defer mu.Unlock()
		if from == f && m.GetType() == raftpb.MsgReadIndex {
			sent++
		}
		if m.GetTo() == f && m.GetType() == raftpb.MsgReadIndexResp {
			held = append(held, m)
			return false
		}
		return true
	})
	count := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return sent, len(held)
	}

	const reads = 5
	var wg sync.WaitGroup
	var answered atomic.Int32
	for i := range reads {
		wg.Go(func() {
			if _, err := c.nodes[f].ReadIndex(testCtx(t)); err != nil {
				t.Errorf("ReadIndex: %v", err)
			}
			answered.Add(1)
		})
		// Each read in a round of its own: wait for its answer (held).
		c.waitFor("the read's answer", func() bool { _, h := count(); return h == i+1 })
	}
	before, _ := count()
	if before != reads {
		t.Fatalf("%d read index messages for %d rounds", before, reads)
	}
	for range electionTicks {
		c.clk.tick()
	}
	c.waitFor("the retry's answer", func() bool { _, h := count(); return h == reads+1 })
	if s, _ := count(); s != reads+1 {
		t.Fatalf("%d read index messages after the timeout, want %d (one retry for %d rounds)", s-before, 1, reads)
	}
	// Late answers to the retired rounds still answer their reads.
	mu.Lock()
	late := held[:reads]
	mu.Unlock()
	for _, m := range late {
		c.deliver(m)
	}
	c.waitFor("every read to be answered", func() bool { return answered.Load() == reads })
	wg.Wait()
}
