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
