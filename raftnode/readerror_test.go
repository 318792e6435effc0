package raftnode

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/quorumlock/quorumlock/storage"
)

// A log read that fails while the node runs (EIO, or a damaged block found
// by a checksum) reaches raft, which panics on any storage error it does
// not expect (raftLog.slice, raftLog.term, maybeSendSnapshot): the whole
// process died. The node must stop instead, with the error, like a failed
// write, and the others carry on.
func TestReadErrorStopsNode(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.waitLeader()
	lag := c.others(lead)[0]
	c.isolate(lag)
	for i := range 20 {
		c.propose(lead, fmt.Sprintf("e%d", i))
	}
	c.waitApplied("e19", lead)

	// The lagging follower needs entries the leader has only in storage.
	injected := fmt.Errorf("read entry: %w: %w", storage.ErrCorrupt, syscall.EIO)
	c.stores[lead].failReads(injected)
	c.heal()
	n := c.nodes[lead]
	stop := c.tickInBackground()
	waitDone(t, "the node to stop after a log read failed", n.Done())
	stop()

	if err := n.Err(); !errors.Is(err, syscall.EIO) || !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("Err() = %v, want it to wrap the read error %v", err, injected)
	}
	if calls := c.fatals[lead].calls(); len(calls) != 1 || !errors.Is(calls[0], syscall.EIO) {
		t.Fatalf("OnFatal calls = %v, want exactly one wrapping the read error", calls)
	}
	if _, err := n.ReadIndex(testCtx(t)); !errors.Is(err, ErrStopped) {
		t.Errorf("ReadIndex after the failure = %v, want ErrStopped", err)
	}
	n.Stop()

	rest := c.others(lead)
	newLead := c.waitLeader(rest...)
	c.propose(newLead, "after")
	c.waitApplied("after", rest...)
}
