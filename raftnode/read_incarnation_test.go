package raftnode

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestReadIndexNotAnsweredForPreviousIncarnation (invariant 9): a follower
// forwards a read round to the leader, then restarts before the round is
// confirmed, then a write commits and a new read is issued. If the new
// incarnation numbered its rounds as the old one did, the leader's late
// answer to the old round (the commit index when THAT request arrived)
// would resolve the new round: ReadIndex would return an index below the
// acknowledged write, a stale read.
func TestReadIndexNotAnsweredForPreviousIncarnation(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	f := c.others(lead)[0]

	var mu sync.Mutex
	var reborn *Node // f's new incarnation: messages to f go to it
	var dropHBResp atomic.Bool
	var readsFromF atomic.Int32
	dropHBResp.Store(true)
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		if m.GetType() == raftpb.MsgHeartbeatResp && m.GetTo() == lead && dropHBResp.Load() {
			return false // read rounds stay unconfirmed
		}
		if from == f && m.GetType() == raftpb.MsgReadIndex {
			readsFromF.Add(1)
		}
		if m.GetTo() == f {
			mu.Lock()
			n := reborn
			mu.Unlock()
			if n != nil {
				n.Step(proto.Clone(m).(*raftpb.Message))
				return false
			}
		}
		return true
	})

	// The old incarnation's round 1 reaches the leader and stays pending.
	oldDone := make(chan error, 1)
	go func() {
		_, err := c.nodes[f].ReadIndex(testCtx(t))
		oldDone <- err
	}()
	c.waitFor("f's read to reach the leader", func() bool { return readsFromF.Load() == 1 })
	c0 := c.nodes[lead].Status().Commit

	// f restarts on the same storage (a crash and a fast restart).
	c.nodes[f].Stop()
	<-oldDone
	n, err := New(Config{
		ID: f, Peers: c.ids, Storage: c.stores[f], Transport: peerTransport{c, f},
		StateMachine: &recSM{}, Clock: c.clk, TickInterval: testTick,
		ElectionTicks: electionTicks, HeartbeatTicks: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	reborn = n
	mu.Unlock()
	n.Start()
	defer n.Stop()

	// A write commits and is acknowledged after the old round was issued.
	c.propose(lead, "w")
	c.waitFor("the leader to apply w", func() bool { return c.sms[lead].indexOf("w") != 0 })
	w := c.sms[lead].indexOf("w")
	if w <= c0 {
		t.Fatalf("w at %d, not after the old round's index %d", w, c0)
	}
	c.waitFor("the new incarnation to know the leader", func() bool { return n.Status().Leader == lead })

	// The new incarnation reads: a read that starts after w was
	// acknowledged must return an index >= w.
	type res struct {
		idx uint64
		err error
	}
	newDone := make(chan res, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		idx, err := n.ReadIndex(ctx)
		newDone <- res{idx, err}
	}()
	c.waitFor("the new incarnation's read to reach the leader", func() bool { return readsFromF.Load() == 2 })
	dropHBResp.Store(false)
	var r res
	c.tickUntil("the new incarnation's read", func() bool {
		select {
		case r = <-newDone:
			return true
		default:
			return false
		}
	})
	if r.err != nil {
		t.Fatalf("ReadIndex on the restarted follower: %v", r.err)
	}
	if r.idx < w {
		t.Fatalf("ReadIndex on the restarted follower = %d, below write w at %d acknowledged before the call (the old incarnation's round was answered at %d): stale read", r.idx, w, c0)
	}
}
