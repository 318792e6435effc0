package raftnode

import (
	"errors"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestPeerMessageRaftPanicsOnStopsNode: a heartbeat whose commit index is
// past the follower's last entry makes raft panic ("tocommit out of
// range"). No correct leader sends one; a forged peer or one that lost its
// state can. The follower stops with ErrBadMessage instead of taking the
// whole process down, its saved state is what it was, and the other two
// go on committing.
func TestPeerMessageRaftPanicsOnStopsNode(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	c.propose(lead, "before")
	c.waitApplied("before", c.ids...)
	f := c.others(lead)[0]
	st := c.nodes[f].Status()
	saved := c.stores[f].hardState()
	last := c.stores[f].lastIndex()

	c.nodes[f].Step(&raftpb.Message{
		Type: raftpb.MsgHeartbeat.Enum(), From: new(lead), To: new(f),
		Term: new(st.Term), Commit: new(last + 1000),
	})
	c.waitFor("the follower to stop", func() bool {
		select {
		case <-c.nodes[f].Done():
			return true
		default:
			return false
		}
	})
	if err := c.nodes[f].Err(); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("Err() = %v after the bad heartbeat; want ErrBadMessage", err)
	}
	if fatals := c.fatals[f].calls(); len(fatals) != 1 || !errors.Is(fatals[0], ErrBadMessage) {
		t.Fatalf("OnFatal calls %v; want one with ErrBadMessage", fatals)
	}
	if got := c.stores[f].hardState(); got.GetCommit() != saved.GetCommit() || got.GetTerm() != saved.GetTerm() || got.GetVote() != saved.GetVote() {
		t.Fatalf("the stopped follower's hard state changed from %v to %v", saved, got)
	}
	if got := c.stores[f].lastIndex(); got != last {
		t.Fatalf("the stopped follower's last index moved from %d to %d", last, got)
	}
	c.propose(lead, "after")
	c.waitApplied("after", c.others(f)...)
}

// TestPeerProposalDropped: proposal forwarding is off, so no correct peer
// sends MsgProp. A leader that stepped one from the wire would append
// whatever it carries (any command, an expiry of every session); it is
// dropped.
func TestPeerProposalDropped(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	f := c.others(lead)[0]
	c.nodes[lead].Step(&raftpb.Message{
		Type: raftpb.MsgProp.Enum(), From: new(f), To: new(lead),
		Entries: []*raftpb.Entry{{Data: []byte("forged")}},
	})
	// The loop steps a queued message before it takes the next proposal,
	// so the forged one, had it been appended, would come before "real".
	c.waitFor("the leader to take the forged message", func() bool { return len(c.nodes[lead].recvc) == 0 })
	c.propose(lead, "real")
	c.waitApplied("real", c.ids...)
	for _, id := range c.ids {
		if c.sms[id].indexOf("forged") != 0 {
			t.Fatalf("member %d applied the forged proposal", id)
		}
	}
}
