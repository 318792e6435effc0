package raftnode

import (
	"fmt"
	"sync"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestReviewHReadIndexDoesNotJoinEarlierRound: a ReadIndex call never shares
// a confirmation round that was issued before the call (DESIGN.md
// invariants 4 and 9). Mutation it catches (review H): a call that arrives
// while a round is in flight joins that round; it is then answered with the
// commit index recorded before it began, below a write the leader committed
// in between, and a heartbeat confirmed that way would rest on a
// confirmation that started before the heartbeat arrived.
//
// The clock is not advanced: raft retries no round and sends no periodic
// heartbeat, so each round's confirmation is exactly the heartbeats the
// hook holds back.
func TestReviewHReadIndexDoesNotJoinEarlierRound(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	n := c.nodes[lead]

	var mu sync.Mutex
	var held []*raftpb.Message // read rounds' heartbeats, in send order
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		if from != lead || m.GetType() != raftpb.MsgHeartbeat || len(m.GetContext()) == 0 {
			return true
		}
		mu.Lock()
		defer mu.Unlock()
		held = append(held, proto.Clone(m).(*raftpb.Message))
		return false
	})
	heldRounds := func() int {
		mu.Lock()
		defer mu.Unlock()
		ctxs := map[string]bool{}
		for _, m := range held {
			ctxs[string(m.GetContext())] = true
		}
		return len(ctxs)
	}

	type answer struct {
		idx uint64
		err error
	}
	first := make(chan answer, 1)
	go func() {
		idx, err := n.ReadIndex(testCtx(t))
		first <- answer{idx, err}
	}()
	c.waitFor("the first round's heartbeats", func() bool { return heldRounds() == 1 })

	// A write the leader commits while the first round is unconfirmed.
	c.propose(lead, "w")
	c.waitFor("the write applied on the leader", func() bool { return c.sms[lead].indexOf("w") != 0 })
	w := c.sms[lead].indexOf("w")

	second := make(chan answer, 1)
	go func() {
		idx, err := n.ReadIndex(testCtx(t))
		second <- answer{idx, err}
	}()
	c.waitFor("the second call to reach the node", func() bool { return len(n.readc) == 0 })
	// Once a later proposal is taken, the loop has handled the second call
	// (and issued its round, if it makes one).
	c.propose(lead, "sync")
	c.waitFor("the sync entry applied on the leader", func() bool { return c.sms[lead].indexOf("sync") != 0 })

	c.setHook(nil)
	mu.Lock()
	rounds := held
	held = nil
	mu.Unlock()
	for _, m := range rounds {
		c.deliver(m)
	}
	a := <-first
	if a.err != nil {
		t.Fatalf("first ReadIndex: %v", a.err)
	}
	var b answer
	select {
	case b = <-second:
	case <-testCtx(t).Done():
		t.Fatal("the second ReadIndex was never answered")
	}
	if b.err != nil {
		t.Fatalf("second ReadIndex: %v", b.err)
	}
	if b.idx < w {
		t.Fatalf("ReadIndex called after the write at %d was applied returned %d (the first round's index %d): it joined a round issued before the call", w, b.idx, a.idx)
	}
}

// TestReviewHLeaderReadyAfterEarlierTermsApplied: a new leader whose
// first commit covers entries of an earlier term, applied over several
// Readys, calls LeaderReady only after the Ready that applies an entry of
// its own term, so it never times sessions on a table that lacks earlier
// entries (DESIGN.md invariant 3: a new leader first applies every entry
// of earlier terms). Mutation it catches (review H): LeaderReady after
// the first Apply of the leadership, whatever the term of its entries.
//
// MaxSizePerMsg of one byte makes raft hand over one committed entry per
// Ready (MaxCommittedSizePerReady defaults to it).
func TestReviewHLeaderReadyAfterEarlierTermsApplied(t *testing.T) {
	c := newClusterWith(t, 3, func(cfg *Config) { cfg.MaxSizePerMsg = 1 })
	old := c.settledLeader()
	rest := c.others(old)

	// Entries of the old leader's term reach every follower, but the old
	// leader never learns it: none of them commits in its term.
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		return !(m.GetTo() == old && m.GetType() == raftpb.MsgAppResp)
	})
	const n = 5
	for i := range n {
		c.propose(old, fmt.Sprintf("e%d", i))
	}
	// Propose returns once raft took the entry, before the old leader
	// saved it: the entries' last index is the one of the last entry in
	// its store. (Its store's last index read at once could miss the last
	// entries under load: the followers were then awaited without them,
	// and the new leader never had e4 to apply.)
	var last uint64
	c.waitFor("the entries in the old leader's log", func() bool {
		last = c.stores[old].indexOf(fmt.Sprintf("e%d", n-1))
		return last != 0
	})
	c.waitFor("the entries on every follower", func() bool {
		for _, id := range rest {
			if c.stores[id].lastIndex() < last {
				return false
			}
		}
		return true
	})
	if a := c.nodes[old].Status().Commit; a >= last {
		t.Fatalf("old leader committed %d, want the entries uncommitted (last %d)", a, last)
	}

	c.setHook(nil)
	c.isolate(old)
	lead := c.waitLeader(rest...)
	c.waitApplied(fmt.Sprintf("e%d", n-1), rest...)
	c.tickUntil("the old leader to step down", func() bool { return c.nodes[old].Status().State != raft.StateLeader })
	c.checkLeadership()
	if !c.sms[lead].readyFor(c.nodes[lead].Status().Term) {
		t.Fatalf("new leader %d not ready", lead)
	}
}
