package raftnode

import (
	"context"
	"errors"
	"sync"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestProposeDeferred: a deferred proposal is held (not appended, its call
// not answered) until the next Propose, which takes it first and sends both
// in one MsgApp; until ReleaseDeferred; or until the next tick. A follower
// refuses it at once.
func TestProposeDeferred(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	f := c.others(lead)[0]
	node := c.nodes[lead]

	var mu sync.Mutex
	var batches [][]string // the data entries of each MsgApp from the leader to f
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		if from == lead && m.GetTo() == f && m.GetType() == raftpb.MessageType_MsgApp {
			var b []string
			for _, e := range m.GetEntries() {
				if len(e.GetData()) > 0 {
					b = append(b, string(e.GetData()))
				}
			}
			if len(b) > 0 {
				mu.Lock()
				batches = append(batches, b)
				mu.Unlock()
			}
		}
		return true
	})
	defer c.setHook(nil)

	// deferred queues what ProposeDeferred queues, from this goroutine, so
	// that it is in the loop's queue when deferred returns.
	deferred := func(data string) chan error {
		p := proposal{data: []byte(data), errc: make(chan error, 1), deferred: true, epoch: node.DeferEpoch()}
		node.propc <- p
		return p.errc
	}
	// held waits until the loop has taken the proposal and finished a later
	// turn (a ReadIndex round, which does not release held entries), then
	// checks that the proposal is still unanswered and unapplied. No tick
	// may pass meanwhile: a tick releases it.
	held := func(data string, errc chan error) {
		t.Helper()
		c.waitFor("the loop to take "+data, func() bool { return len(node.propc) == 0 })
		if _, err := node.ReadIndex(testCtx(t)); err != nil {
			t.Fatalf("ReadIndex: %v", err)
		}
		select {
		case err := <-errc:
			t.Fatalf("ProposeDeferred(%q) returned %v before any release", data, err)
		default:
		}
		if c.sms[lead].indexOf(data) != 0 {
			t.Fatalf("%q applied while held", data)
		}
	}
	released := func(data string, errc chan error) {
		t.Helper()
		select {
		case err := <-errc:
			if err != nil {
				t.Fatalf("ProposeDeferred(%q): %v", data, err)
			}
		case <-testCtx(t).Done():
			t.Fatalf("ProposeDeferred(%q) not answered", data)
		}
	}

	// The next Propose takes the held entry first, in the same MsgApp.
	d1 := deferred("d1")
	held("d1", d1)
	mu.Lock()
	batches = nil
	mu.Unlock()
	c.propose(lead, "p1")
	released("d1", d1)
	c.waitApplied("p1", c.ids...)
	if i, j := c.sms[lead].indexOf("d1"), c.sms[lead].indexOf("p1"); i == 0 || i >= j {
		t.Fatalf("d1 at index %d, p1 at %d: want d1 first", i, j)
	}
	mu.Lock()
	if len(batches) == 0 || len(batches[0]) != 2 || batches[0][0] != "d1" || batches[0][1] != "p1" {
		t.Fatalf("MsgApps to %d carried %v; want [d1 p1] in the first", f, batches)
	}
	mu.Unlock()

	// ReleaseDeferred proposes it without another proposal.
	d2 := deferred("d2")
	held("d2", d2)
	node.ReleaseDeferred()
	released("d2", d2)

	// So does the next tick.
	d3 := deferred("d3")
	held("d3", d3)
	c.clk.tick()
	released("d3", d3)
	c.waitApplied("d3", c.ids...)

	// The call of a held entry ends with its context (DESIGN.md invariant
	// 12). (The entry stays queued, as any proposal handed to the loop
	// does.)
	ctx, cancel := context.WithCancel(testCtx(t))
	d4 := make(chan error, 1)
	go func() { d4 <- node.ProposeDeferred(ctx, []byte("d4"), node.DeferEpoch()) }()
	held("d4", d4)
	cancel()
	if err := <-d4; !errors.Is(err, context.Canceled) {
		t.Fatalf("ProposeDeferred(d4) after its context ended: %v, want context.Canceled", err)
	}

	// A follower does not hold: it refuses at once.
	if err := c.nodes[f].ProposeDeferred(testCtx(t), []byte("f"), c.nodes[f].DeferEpoch()); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("ProposeDeferred on follower %d: %v; want ErrNotLeader", f, err)
	}
}

// TestProposeDeferredStaleEpoch: a deferred proposal whose caller decided
// to defer before a ReleaseDeferred call (which found nothing held: the
// proposal had not reached the loop) is not held; one decided after it is.
func TestProposeDeferredStaleEpoch(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	node := c.nodes[lead]

	stale := node.DeferEpoch()
	node.ReleaseDeferred() // nothing held yet
	if err := node.ProposeDeferred(testCtx(t), []byte("late"), stale); err != nil {
		t.Fatalf("ProposeDeferred with an epoch older than a ReleaseDeferred: %v", err)
	}
	c.waitApplied("late", c.ids...)

	p := proposal{data: []byte("fresh"), errc: make(chan error, 1), deferred: true, epoch: node.DeferEpoch()}
	node.propc <- p
	c.waitFor("the loop to take fresh", func() bool { return len(node.propc) == 0 })
	if _, err := node.ReadIndex(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.errc:
		t.Fatalf("a deferred proposal with the current epoch was not held: %v", err)
	default:
	}
	node.ReleaseDeferred()
	if err := <-p.errc; err != nil {
		t.Fatal(err)
	}
}

// TestProposeAsync: an entry handed to ProposeAsync on the leader is
// applied everywhere and never refused; a deferred one is held like
// ProposeDeferred's until the next proposal, which it precedes; on a
// follower the entry is refused with ErrNotLeader through Refused, and
// never applied.
func TestProposeAsync(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	f := c.others(lead)[0]
	node := c.nodes[lead]

	refusals := make(chan error, 4)
	refused := func(err error) { refusals <- err }
	ctx := testCtx(t)

	if err := node.ProposeAsync(ctx, AsyncProposal{Data: []byte("a1"), Refused: refused}); err != nil {
		t.Fatalf("ProposeAsync on the leader: %v", err)
	}
	c.waitApplied("a1", c.ids...)

	if err := node.ProposeAsync(ctx, AsyncProposal{Data: []byte("d1"), Deferred: true, Epoch: node.DeferEpoch(), Refused: refused}); err != nil {
		t.Fatalf("deferred ProposeAsync on the leader: %v", err)
	}
	c.waitFor("the loop to take d1", func() bool { return len(node.propc) == 0 })
	if _, err := node.ReadIndex(ctx); err != nil {
		t.Fatalf("ReadIndex: %v", err)
	}
	if c.sms[lead].indexOf("d1") != 0 {
		t.Fatal("a deferred d1 applied before any release")
	}
	c.propose(lead, "p1")
	c.waitApplied("p1", c.ids...)
	c.waitApplied("d1", c.ids...)
	if i, j := c.sms[lead].indexOf("d1"), c.sms[lead].indexOf("p1"); i >= j {
		t.Fatalf("d1 at index %d, p1 at %d: want d1 first", i, j)
	}

	if err := c.nodes[f].ProposeAsync(ctx, AsyncProposal{Data: []byte("f1"), Refused: refused}); err != nil {
		t.Fatalf("ProposeAsync on follower %d: %v", f, err)
	}
	select {
	case err := <-refusals:
		if !errors.Is(err, ErrNotLeader) {
			t.Fatalf("follower %d refused f1 with %v, want ErrNotLeader", f, err)
		}
	case <-ctx.Done():
		t.Fatalf("follower %d never refused f1", f)
	}
	// A later entry through the leader is applied; f1 never is.
	c.propose(lead, "p2")
	c.waitApplied("p2", c.ids...)
	for _, id := range c.ids {
		if c.sms[id].indexOf("f1") != 0 {
			t.Fatalf("f1, refused by follower %d, applied on %d", f, id)
		}
	}
	select {
	case err := <-refusals:
		t.Fatalf("an extra refusal: %v", err)
	default:
	}
}
