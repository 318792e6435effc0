package raftnode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitDone fails the test unless c closes within waitTimeout.
func waitDone(t *testing.T, what string, c <-chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(waitTimeout):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// waitGroup waits for wg within waitTimeout.
func waitGroup(t *testing.T, what string, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	waitDone(t, what, done)
}

// TestPersistBeforeSend checks the Ready contract (invariant 10) on every
// message of an election, replication and a leadership transfer: the
// harness's transport compares each outgoing message with the sender's
// store at the moment Send is called.
func TestPersistBeforeSend(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.waitLeader()
	for i := range 20 {
		c.propose(lead, fmt.Sprintf("a%02d", i))
	}
	c.waitApplied("a19", c.ids...)

	next := c.others(lead)[0]
	c.transfer(next)
	for i := range 20 {
		c.propose(next, fmt.Sprintf("b%02d", i))
	}
	c.waitApplied("b19", c.ids...)

	if v := c.takeViolations(); len(v) > 0 {
		t.Fatalf("messages sent before what they depend on was saved:\n%v", v)
	}
	// The checks above must have run on the messages that matter.
	for _, what := range []string{"entries sent", "votes granted", "appends acknowledged"} {
		if c.count(what) == 0 {
			t.Errorf("no %s were checked", what)
		}
	}
}

// TestLeaderWritesInParallel: a leader sends new entries to its followers
// before its own Save of them returns (raft thesis §10.2.1), so a commit
// costs about one fsync, not two in series. With the leader's Save held,
// both followers save the entry; the leader applies it only once its Save
// has returned.
func TestLeaderWritesInParallel(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.waitLeader()
	c.propose(lead, "warm")
	c.waitApplied("warm", c.ids...)

	g := c.stores[lead].holdNextSave()
	c.propose(lead, "parallel")
	waitDone(t, "the leader's Save to block", g.entered)
	want := c.stores[lead].lastIndex() + 1 // the held entry's index
	c.waitFor("both followers to save the entry the leader is still writing", func() bool {
		for _, id := range c.others(lead) {
			if c.stores[id].lastIndex() < want {
				return false
			}
		}
		return true
	})
	if c.sms[lead].indexOf("parallel") != 0 {
		t.Fatal("the leader applied an entry while its Save of it was held")
	}
	g.open()
	c.waitApplied("parallel", c.ids...)
	if c.count("entries sent before the leader saved them") == 0 {
		t.Error("the harness saw no append sent ahead of the leader's Save")
	}
	if v := c.takeViolations(); len(v) > 0 {
		t.Fatalf("violations:\n%v", v)
	}
}

// TestSaveErrorStopsNode: a failed Save stops the node for good and
// nothing of the failed Ready (or after it) leaves the node.
func TestSaveErrorStopsNode(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.waitLeader()
	c.propose(lead, "before")
	c.waitApplied("before", c.ids...)

	n := c.nodes[lead]
	injected := errors.New("injected fsync failure")
	c.stores[lead].failNow(injected)
	// The proposal enters raft's log; the Save of its Ready fails. Whether
	// Propose sees the acceptance or the stop first is a race.
	if err := n.Propose(testCtx(t), []byte("doomed")); err != nil && !errors.Is(err, ErrStopped) {
		t.Fatalf("Propose on the failing leader: %v", err)
	}
	waitDone(t, "the node to stop after its Save failed", n.Done())

	if calls := c.fatals[lead].calls(); len(calls) != 1 || !errors.Is(calls[0], injected) {
		t.Fatalf("OnFatal calls = %v, want exactly one wrapping %v", calls, injected)
	}
	if err := n.Err(); !errors.Is(err, injected) {
		t.Fatalf("Err() = %v, want it to wrap %v", err, injected)
	}
	if !c.stores[lead].hasFailed() {
		t.Fatal("the node stopped but its store never returned the error")
	}
	ctx := testCtx(t)
	if err := n.Propose(ctx, []byte("later")); !errors.Is(err, ErrStopped) {
		t.Errorf("Propose after the failure = %v, want ErrStopped", err)
	}
	if _, err := n.ReadIndex(ctx); !errors.Is(err, ErrStopped) {
		t.Errorf("ReadIndex after the failure = %v, want ErrStopped", err)
	}
	if err := n.WaitApplied(ctx, 1<<40); !errors.Is(err, ErrStopped) {
		t.Errorf("WaitApplied after the failure = %v, want ErrStopped", err)
	}
	if got := c.sms[lead].lastLeadershipEvent(); got != "lost" {
		t.Errorf("the stopped leader's last leadership call is %q, want LeaderLost", got)
	}
	n.Stop() // idempotent after a fatal stop
	if calls := c.fatals[lead].calls(); len(calls) != 1 {
		t.Errorf("OnFatal called %d times, want 1", len(calls))
	}

	// The other two carry on. The leader sent the entry whose Save failed
	// while it was writing it (raft thesis §10.2.1), so the followers may
	// have saved and committed it without the leader: they must agree on
	// it, and the failed leader applied nothing after its failure.
	rest := c.others(lead)
	newLead := c.waitLeader(rest...)
	c.propose(newLead, "after")
	c.waitApplied("after", rest...)
	if a, b := c.sms[rest[0]].indexOf("doomed"), c.sms[rest[1]].indexOf("doomed"); a != b {
		t.Errorf("the followers applied the entry whose Save failed at indexes %d and %d", a, b)
	}
	if c.sms[lead].indexOf("doomed") != 0 {
		t.Errorf("the leader applied the entry whose Save failed")
	}
	if v := c.takeViolations(); len(v) > 0 {
		t.Fatalf("sent after a failed Save:\n%v", v)
	}
}

// TestProposalBatching: proposals that queue while the leader is busy
// (here: its previous write is slow) go into one Ready and one Save, and
// every node applies the same entries in the same order.
func TestProposalBatching(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.waitLeader()
	n := c.nodes[lead]

	// Sequential proposals keep their order.
	var want []string
	for i := range 10 {
		d := fmt.Sprintf("s%02d", i)
		c.propose(lead, d)
		want = append(want, d)
	}
	// Their Readys are saved before the next write is held.
	c.waitApplied(want[len(want)-1], c.ids...)

	g := c.stores[lead].holdNextSave()
	c.propose(lead, "slow")
	want = append(want, "slow")
	waitDone(t, "the leader's Save to block", g.entered)
	before := len(c.stores[lead].saveCalls())

	const concurrent = 200
	errs := make(chan error, concurrent)
	var wg sync.WaitGroup
	batch := make(map[string]bool)
	for i := range concurrent {
		d := fmt.Sprintf("c%03d", i)
		batch[d] = true
		wg.Go(func() { errs <- n.Propose(testCtx(t), []byte(d)) })
	}
	c.waitFor("the proposals to queue", func() bool { return len(n.propc) == concurrent })
	g.open()
	waitGroup(t, "the proposals", &wg)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Propose: %v", err)
		}
	}

	total := len(want) + concurrent
	c.tickUntil("every entry applied everywhere", func() bool {
		for _, id := range c.ids {
			if len(c.sms[id].data()) < total {
				return false
			}
		}
		return true
	})
	var calls, entries int
	for _, s := range c.stores[lead].saveCalls()[before:] {
		if s.data > 0 {
			calls++
			entries += s.data
		}
	}
	if entries != concurrent+1 {
		t.Fatalf("leader saved %d proposals after the slow write began, want %d", entries, concurrent+1)
	}
	if calls > 2 {
		t.Errorf("leader used %d Saves for the slow write and %d queued proposals, want 2 (one per Ready)", calls, concurrent)
	}

	ref := c.sms[lead].data()
	if len(ref) != total {
		t.Fatalf("leader applied %d entries, want %d", len(ref), total)
	}
	if !slices.Equal(ref[:len(want)], want) {
		t.Errorf("sequential proposals applied as %v, want %v", ref[:len(want)], want)
	}
	for _, d := range ref[len(want):] {
		if !batch[d] {
			t.Errorf("unexpected or repeated entry %q", d)
		}
		delete(batch, d)
	}
	for _, id := range c.ids {
		if got := c.sms[id].data(); !slices.Equal(got, ref) {
			t.Errorf("node %d applied a different sequence than the leader %d", id, lead)
		}
	}
}

// TestLeaderReadyAndLost: LeaderReady is called once per leadership, right
// after the new leader applied an entry of its own term; LeaderLost when
// leadership moves away (a transfer, then a partition).
func TestLeaderReadyAndLost(t *testing.T) {
	c := newCluster(t, 3)
	l1 := c.waitLeader()
	t1 := c.nodes[l1].Status().Term

	l2 := c.others(l1)[0]
	c.transfer(l2)
	t2 := c.nodes[l2].Status().Term
	c.tickUntil("LeaderLost on the old leader", func() bool { return c.sms[l1].lastLeadershipEvent() == "lost" })

	c.isolate(l2)
	rest := c.others(l2)
	l3 := c.waitLeader(rest...)
	t3 := c.nodes[l3].Status().Term
	c.tickUntil("LeaderLost on the partitioned leader", func() bool {
		return c.sms[l2].lastLeadershipEvent() == "lost" && c.nodes[l2].Status().State != raft.StateLeader
	})
	c.heal()
	c.propose(l3, "healed")
	c.waitApplied("healed", c.ids...)

	ready := c.checkLeadership()
	if !slices.Contains(ready[l1], t1) || !slices.Contains(ready[l2], t2) || !slices.Contains(ready[l3], t3) {
		t.Fatalf("LeaderReady terms by node = %v, want %d:%d, %d:%d, %d:%d", ready, l1, t1, l2, t2, l3, t3)
	}
	if !(t1 < t2 && t2 < t3) {
		t.Fatalf("terms %d, %d, %d do not increase", t1, t2, t3)
	}
	if got := c.sms[l3].lastLeadershipEvent(); got != "ready" {
		t.Errorf("current leader %d's last leadership call is %q, want LeaderReady", l3, got)
	}
	c.nodes[l3].Stop()
	if got := c.sms[l3].lastLeadershipEvent(); got != "lost" {
		t.Errorf("stopped leader %d's last leadership call is %q, want LeaderLost", l3, got)
	}
}

// TestReadIndexSharesRounds: ReadIndex calls that arrive together share
// one confirmation round (one heartbeat with a read context per follower).
func TestReadIndexSharesRounds(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.waitLeader()
	n := c.nodes[lead]
	follower := c.others(lead)[0]
	var counting atomic.Bool
	var rounds atomic.Int64
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		if counting.Load() && from == lead && m.GetTo() == follower &&
			m.GetType() == raftpb.MsgHeartbeat && len(m.GetContext()) > 0 {
			rounds.Add(1)
		}
		return true
	})
	c0 := n.Status().Commit

	// Keep the leader's loop busy in a slow write while the reads arrive.
	g := c.stores[lead].holdNextSave()
	c.propose(lead, "busy")
	waitDone(t, "the leader's Save to block", g.entered)

	const reads = 50
	idx := make([]uint64, reads)
	errs := make([]error, reads)
	var wg sync.WaitGroup
	for i := range reads {
		wg.Go(func() { idx[i], errs[i] = n.ReadIndex(testCtx(t)) })
	}
	c.waitFor("the reads to queue", func() bool { return len(n.readc) == reads })
	counting.Store(true)
	g.open()
	waitGroup(t, "the reads", &wg)
	counting.Store(false)

	for i := range reads {
		if errs[i] != nil {
			t.Fatalf("ReadIndex %d: %v", i, errs[i])
		}
		if idx[i] < c0 {
			t.Fatalf("ReadIndex %d = %d, below the commit index %d at the call", i, idx[i], c0)
		}
	}
	if r := rounds.Load(); r == 0 || r > 2 {
		t.Fatalf("%d concurrent ReadIndex calls took %d confirmation rounds, want 1", reads, r)
	}
	if err := n.WaitApplied(testCtx(t), slices.Max(idx)); err != nil {
		t.Fatalf("WaitApplied: %v", err)
	}
}

// TestReadIndexCutOff: a replica cut off from the majority (the old
// leader, or a follower) never answers a ReadIndex; once healed, its
// ReadIndex covers what the majority wrote meanwhile (invariant 9).
func TestReadIndexCutOff(t *testing.T) {
	for _, who := range []string{"leader", "follower"} {
		t.Run(who, func(t *testing.T) {
			c := newCluster(t, 3)
			lead := c.waitLeader()
			cutOff := lead
			if who == "follower" {
				cutOff = c.others(lead)[0]
			}
			n := c.nodes[cutOff]
			c.isolate(cutOff)
			stop := c.tickInBackground()

			const wait = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			idx, err := n.ReadIndex(ctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("ReadIndex on the cut-off %s = %d, %v; want the context's deadline error", who, idx, err)
			}

			rest := c.others(cutOff)
			var newLead uint64
			c.waitFor("a leader of the majority", func() bool {
				newLead = c.leaderAmong(rest)
				return newLead != 0
			})
			if err := c.nodes[newLead].Propose(testCtx(t), []byte("w")); err != nil {
				t.Fatalf("Propose on %d: %v", newLead, err)
			}
			c.waitFor("the majority's write", func() bool { return c.sms[newLead].indexOf("w") != 0 })
			w := c.sms[newLead].indexOf("w")

			c.heal()
			idx, err = n.ReadIndex(testCtx(t))
			if err != nil {
				t.Fatalf("ReadIndex after healing: %v", err)
			}
			if idx < w {
				t.Fatalf("ReadIndex after healing = %d, below the majority's write at %d", idx, w)
			}
			if err := n.WaitApplied(testCtx(t), idx); err != nil {
				t.Fatalf("WaitApplied(%d): %v", idx, err)
			}
			if c.sms[cutOff].indexOf("w") != w {
				t.Fatalf("after WaitApplied(%d), node %d has not applied the write at %d", idx, cutOff, w)
			}
			stop()
		})
	}
}

// TestReadIndexOnFollower: a follower's ReadIndex goes through the leader:
// it returns at least the leader's commit index at the call even though
// the follower has not received those entries, and WaitApplied (and so
// LinearizableRead) completes only once they arrive.
func TestReadIndexOnFollower(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.waitLeader()
	f := c.others(lead)[0]
	var mu sync.Mutex
	var held []*raftpb.Message
	holding := true
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		if from != lead || m.GetTo() != f || m.GetType() != raftpb.MsgApp {
			return true
		}
		mu.Lock()
		defer mu.Unlock()
		if holding {
			held = append(held, proto.Clone(m).(*raftpb.Message))
		}
		return !holding
	})
	for i := range 5 {
		c.propose(lead, fmt.Sprintf("r%d", i))
	}
	c.waitFor("the leader to apply r4", func() bool { return c.sms[lead].indexOf("r4") != 0 })
	c0 := c.nodes[lead].Status().Commit
	if a := c.nodes[f].Status().Applied; a >= c0 {
		t.Fatalf("follower applied %d though appends up to %d were held", a, c0)
	}

	idx, err := c.nodes[f].ReadIndex(testCtx(t))
	if err != nil {
		t.Fatalf("ReadIndex on the follower: %v", err)
	}
	if idx < c0 {
		t.Fatalf("ReadIndex on the follower = %d, below the leader's commit %d at the call", idx, c0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err = c.nodes[f].WaitApplied(ctx, idx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitApplied(%d) while the entries are held = %v, want the context's deadline error", idx, err)
	}
	// LinearizableRead is the two together: it too waits for the held
	// entries, not only for the leader's confirmation.
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	err = c.nodes[f].LinearizableRead(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LinearizableRead while the entries are held = %v, want the context's deadline error", err)
	}

	mu.Lock()
	holding = false
	for _, m := range held {
		c.deliver(m)
	}
	mu.Unlock()
	c.tickInBackground()
	if err := c.nodes[f].WaitApplied(testCtx(t), idx); err != nil {
		t.Fatalf("WaitApplied(%d): %v", idx, err)
	}
	if got := c.sms[f].data(); !slices.Equal(got, []string{"r0", "r1", "r2", "r3", "r4"}) {
		t.Fatalf("follower applied %v", got)
	}
	if err := c.nodes[f].LinearizableRead(testCtx(t)); err != nil {
		t.Fatalf("LinearizableRead once the entries arrived: %v", err)
	}
}

// TestProposeOnFollower: only the leader accepts proposals.
func TestProposeOnFollower(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.waitLeader()
	for _, id := range c.others(lead) {
		if err := c.nodes[id].Propose(testCtx(t), []byte("x")); !errors.Is(err, ErrNotLeader) {
			t.Errorf("Propose on follower %d = %v, want ErrNotLeader", id, err)
		}
	}
	c.propose(lead, "y")
	c.waitApplied("y", c.ids...)
	for _, id := range c.ids {
		if c.sms[id].indexOf("x") != 0 {
			t.Errorf("node %d applied a proposal made on a follower", id)
		}
	}
}

// TestSnapshotDue: snapshots come every SnapshotEntries entries, but not
// before the payload applied since the last one reaches a quarter of its
// image, so a large table is not rewritten for a few entries.
func TestSnapshotDue(t *testing.T) {
	for _, c := range []struct {
		entries        uint64
		payload, image int
		want           bool
	}{
		{entries: 9, payload: 1 << 20, image: 0, want: false}, // too few entries
		{entries: 10, payload: 0, image: 0, want: true},       // first snapshot
		{entries: 10, payload: 400, image: 1000, want: true},  // small table
		{entries: 10, payload: 1000, image: 20 << 20, want: false},
		{entries: 90_000, payload: 5 << 20, image: 20 << 20, want: true},
		{entries: 90_000, payload: 5<<20 - 1, image: 20 << 20, want: false},
	} {
		if got := snapshotDue(c.entries, c.payload, c.image, 10); got != c.want {
			t.Errorf("snapshotDue(%d entries, %d bytes, image %d) = %v, want %v", c.entries, c.payload, c.image, got, c.want)
		}
	}
}

// TestCampaignOnLostLeaderConnection: a follower told that its leader's
// connection broke (the transport's ReportUnreachable) campaigns once (a
// pre-vote) as soon as it has not heard from the leader for two heartbeat
// intervals plus its stagger. When every follower lost the leader (it
// died), they elect a new one within a few ticks instead of waiting a random
// one to two election timeouts; when one follower alone lost its connection
// to a live leader, nothing changes (the other follower refuses the
// pre-vote while it hears from the leader, CheckQuorum's lease).
func TestCampaignOnLostLeaderConnection(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	term := c.nodes[lead].Status().Term
	// The assertions count ticks: give each one time for the heartbeats
	// and answers it causes (tickUntil's pause can be too short for them
	// under the race detector, and the followers' silence counters would
	// run ahead of the messages).
	calmTick := func() {
		c.clk.tick()
		time.Sleep(2 * time.Millisecond)
	}
	calmTick()
	calmTick()

	// One follower's connection to the live leader breaks, and the
	// leader's next heartbeat to it is a tick late. A pre-candidate forgets
	// its leader (reads and forwarded requests on it would stall): a
	// follower that still hears from the leader must not become one.
	f := c.others(lead)[0]
	var late atomic.Bool
	late.Store(true)
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		return !(late.Load() && from == lead && m.GetTo() == f)
	})
	c.nodes[f].ReportUnreachable(lead)
	for i := range 3 * electionTicks {
		if i == 1 {
			late.Store(false)
		}
		calmTick()
		if st := c.nodes[f].Status(); st.State != raft.StateFollower {
			t.Fatalf("tick %d: the follower that reported a live leader became %v", i, st.State)
		}
	}
	c.setHook(nil)
	if st := c.nodes[lead].Status(); st.State != raft.StateLeader || st.Term != term {
		t.Fatalf("one follower's report about a live leader disrupted it: %+v (term was %d)", st, term)
	}
	if st := c.nodes[f].Status(); st.Leader != lead || st.Term != term {
		t.Fatalf("the follower that reported the live leader did not return to it: %+v", st)
	}

	c.isolate(lead)
	rest := c.others(lead)
	// The transport reports a broken stream after the messages that came
	// through it: let the followers handle those first (one handled after
	// the report would show the leader alive and cancel the suspicion).
	time.Sleep(2 * time.Millisecond)
	for _, id := range rest {
		c.waitFor("queued messages to be handled", func() bool { return len(c.nodes[id].recvc) == 0 })
	}
	for _, id := range rest {
		c.nodes[id].ReportUnreachable(lead)
	}
	// A read on a follower, sent to the dead leader: it is issued again as
	// soon as a new leader is known, not an election timeout later.
	var read atomic.Bool
	go func() {
		if _, err := c.nodes[rest[0]].ReadIndex(testCtx(t)); err != nil {
			t.Errorf("ReadIndex: %v", err)
		}
		read.Store(true)
	}()
	c.waitFor("the read to be issued", func() bool { return len(c.nodes[rest[0]].readc) == 0 })
	// Ticks are counted, so each is given time for the pre-vote, vote and
	// append rounds it may start (tickUntil's pause can be too short for
	// them under the race detector, and more ticks would pass meanwhile).
	ticks := 0
	slowTickUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(waitTimeout)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			c.clk.tick()
			ticks++
			for range 100 { // up to 25 ms a tick
				if cond() {
					return
				}
				time.Sleep(250 * time.Microsecond)
			}
		}
	}
	slowTickUntil("a new leader", func() bool { return c.leaderAmong(rest) != 0 })
	if ticks >= electionTicks {
		t.Errorf("a new leader took %d ticks after the reports; without them it takes at least an election timeout (%d)", ticks, electionTicks)
	}
	slowTickUntil("the read", read.Load)
	if ticks >= electionTicks {
		t.Errorf("the read sent to the dead leader was answered %d ticks after the failure; a retry after an election timeout (%d) takes longer", ticks, electionTicks)
	}
}

// TestResign: a leader hands leadership to the voter with the longest log
// without waiting for an election timeout (no tick passes during the
// transfer, so no election timer can have fired), and returns once the
// transferee leads.
func TestResign(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	fs := c.others(lead)
	behind, ahead := fs[0], fs[1]

	// behind misses the next entry: the transfer must pick ahead.
	c.setHook(func(from uint64, m *raftpb.Message) bool { return !(from == lead && m.GetTo() == behind) })
	c.propose(lead, "y")
	c.waitApplied("y", lead, ahead)
	term := c.nodes[lead].Status().Term

	if err := c.nodes[ahead].Resign(testCtx(t)); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("Resign on a follower: %v, want ErrNotLeader", err)
	}
	if err := c.nodes[lead].Resign(testCtx(t)); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	if st := c.nodes[lead].Status(); st.State != raft.StateFollower || st.Leader != ahead || st.Term != term+1 {
		t.Fatalf("the resigned leader is %v following %d in term %d; want a follower of %d in term %d", st.State, st.Leader, st.Term, ahead, term+1)
	}
	// The transferee publishes its own Status after its Ready, which may
	// come after the old leader has heard from it.
	c.waitFor("the transferee to report itself leader", func() bool {
		st := c.nodes[ahead].Status()
		return st.State == raft.StateLeader && st.Term == term+1
	})
	c.setHook(nil)
	c.propose(ahead, "z")
	c.waitApplied("z", c.ids...)
}

// TestResignAlone: a single-member cluster has nobody to hand over to.
func TestResignAlone(t *testing.T) {
	c := newCluster(t, 1)
	lead := c.waitLeader()
	if err := c.nodes[lead].Resign(testCtx(t)); !errors.Is(err, ErrNoTransferee) {
		t.Fatalf("Resign alone: %v, want ErrNoTransferee", err)
	}
	if st := c.nodes[lead].Status(); st.State != raft.StateLeader {
		t.Fatalf("still %v; want leader", st.State)
	}
}

// TestResignSkipsUnreachable: a voter the leader has not heard from for an
// election timeout is never the transferee, even with an equal log and the
// lower ID (a transfer to it would only hold proposals off until raft
// abandons it).
func TestResignSkipsUnreachable(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	fs := c.others(lead) // ascending
	down, up := fs[0], fs[1]
	c.setHook(func(from uint64, m *raftpb.Message) bool { return from != down && m.GetTo() != down })
	for range 2 * electionTicks {
		c.clk.tick()
		time.Sleep(200 * time.Microsecond)
	}
	if err := c.nodes[lead].Resign(testCtx(t)); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	if st := c.nodes[lead].Status(); st.Leader != up {
		t.Fatalf("after Resign the old leader follows %d; want the reachable follower %d", st.Leader, up)
	}
	c.waitFor("the reachable follower to report itself leader", func() bool { return c.nodes[up].Status().State == raft.StateLeader })
	c.setHook(nil)
}

// TestOnSaveReportsWrites: OnSave reports the Saves that write (new entries,
// term or vote), not the commit-only hard states a leader hands to Save
// after every commit, which the stores do not write.
func TestOnSaveReportsWrites(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.waitLeader()
	c.mu.Lock()
	before := len(c.onSave[lead])
	c.mu.Unlock()
	for i := range 5 {
		d := fmt.Sprint("w", i)
		c.propose(lead, d)
		c.waitApplied(d, c.ids...)
	}
	c.mu.Lock()
	calls := c.onSave[lead][before:]
	c.mu.Unlock()
	entries := 0
	for _, e := range calls {
		if e == 0 {
			t.Errorf("OnSave reported a Save without entries on the leader in a stable term: %v", calls)
			break
		}
		entries += e
	}
	if entries != 5 {
		t.Errorf("OnSave reported %d entries for 5 proposals (%v)", entries, calls)
	}
}

// TestProposalsBatched: the proposals queued while the leader's loop was
// busy (here in a held Save) go to raft as one batch, so each follower gets
// them in one MsgApp, not one MsgApp (and one MsgAppResp) per proposal.
func TestProposalsBatched(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.waitLeader()
	c.propose(lead, "warm")
	c.waitApplied("warm", c.ids...)
	f := c.others(lead)[0]

	var mu sync.Mutex
	var sizes []int // data entries of each MsgApp from the leader to f
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		if from == lead && m.GetTo() == f && m.GetType() == raftpb.MessageType_MsgApp {
			k := 0
			for _, e := range m.GetEntries() {
				if len(e.GetData()) > 0 {
					k++
				}
			}
			if k > 0 {
				mu.Lock()
				sizes = append(sizes, k)
				mu.Unlock()
			}
		}
		return true
	})
	defer c.setHook(nil)

	g := c.stores[lead].holdNextSave()
	c.propose(lead, "hold")
	waitDone(t, "the leader's Save to block", g.entered)
	const n = 10
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.propose(lead, fmt.Sprint("b", i))
		}()
	}
	c.waitFor("the proposals to queue", func() bool { return len(c.nodes[lead].propc) == n })
	mu.Lock()
	sizes = nil
	mu.Unlock()
	g.open()
	wg.Wait()
	for i := range n {
		c.waitApplied(fmt.Sprint("b", i), c.ids...)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) != 1 || sizes[0] != n {
		t.Fatalf("the %d queued proposals reached follower %d in MsgApps of %v data entries; want one of %d", n, f, sizes, n)
	}
}

// TestReportAfterQueuedMessages: an unreachable report is handled after the
// messages already queued (they came through the connection before it
// broke), so the dead leader's last heartbeat does not cancel the
// suspicion that starts the fast campaign. (A failover in the bench took
// an election timeout when it did.) The node is not started: the test
// plays its loop.
func TestReportAfterQueuedMessages(t *testing.T) {
	n, err := New(Config{
		ID: 1, Peers: []uint64{1, 2, 3}, Storage: newMemStore(), Transport: peerTransport{},
		StateMachine: &recSM{}, TickInterval: testTick, ElectionTicks: electionTicks,
	})
	if err != nil {
		t.Fatal(err)
	}
	n.recvc <- &raftpb.Message{Type: raftpb.MessageType_MsgHeartbeat.Enum(), From: new(uint64(2)), To: new(uint64(1)), Term: new(uint64(5))}
	n.report(report{unreachable: 2})
	if n.suspect != 2 || n.suspectAt != 5 {
		t.Fatalf("suspect %d in term %d after the leader's queued heartbeat and the report; want 2 in term 5", n.suspect, n.suspectAt)
	}
	n.step(&raftpb.Message{Type: raftpb.MessageType_MsgHeartbeat.Enum(), From: new(uint64(2)), To: new(uint64(1)), Term: new(uint64(5))})
	if n.suspect != 0 {
		t.Fatal("a heartbeat from the leader after the report left it suspect")
	}
}

// TestCampaignAgainAfterRefusingAPreVote: the leader dies while the
// follower that campaigns first (the lower ID, the shorter stagger) has a
// longer log than the other. Its pre-vote is refused under the other's
// lease; the other's pre-vote is refused by it (that log is behind). It
// then campaigns again and wins within a few ticks, instead of both waiting
// for raft's randomized election timer.
func TestCampaignAgainAfterRefusingAPreVote(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	fs := c.others(lead)
	ahead, behind := fs[0], fs[1] // ahead has the lower ID: it campaigns first

	c.setHook(func(from uint64, m *raftpb.Message) bool {
		return !(from == lead && m.GetTo() == behind && m.GetType() == raftpb.MessageType_MsgApp)
	})
	c.propose(lead, "y")
	c.waitApplied("y", lead, ahead)
	c.isolate(lead)
	c.setHook(nil)
	time.Sleep(2 * time.Millisecond)
	for _, id := range fs {
		c.waitFor("queued messages to be handled", func() bool { return len(c.nodes[id].recvc) == 0 })
	}
	for _, id := range fs {
		c.nodes[id].ReportUnreachable(lead)
	}
	ticks := 0
	deadline := time.Now().Add(waitTimeout)
	for c.leaderAmong(fs) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for a new leader")
		}
		c.clk.tick()
		ticks++
		for range 100 { // up to 25 ms a tick for the pre-vote, vote and append rounds
			if c.leaderAmong(fs) != 0 {
				break
			}
			time.Sleep(250 * time.Microsecond)
		}
	}
	if got := c.leaderAmong(fs); got != ahead {
		t.Fatalf("new leader %d, want %d (the longer log)", got, ahead)
	}
	if ticks >= electionTicks {
		t.Fatalf("a new leader took %d ticks after the reports; raft's own timer takes at least an election timeout (%d)", ticks, electionTicks)
	}
}

// A failed Save stops the node even when the store would succeed if asked
// again (DESIGN.md invariant 10; docs/storage.md: after a failed fsync
// the kernel may have dropped the written pages and marked them clean, so
// a retry that "works" could acknowledge what is not on disk). The store
// here fails one Save and would accept the next: the node must not make
// it, must send nothing more, and must stop with the error. Run for a
// leader and for a follower.
func TestSaveErrorIsNotRetried(t *testing.T) {
	for _, role := range []string{"leader", "follower"} {
		t.Run(role, func(t *testing.T) {
			c := newCluster(t, 3)
			lead := c.waitLeader()
			c.propose(lead, "before")
			c.waitApplied("before", c.ids...)
			victim := lead
			if role == "follower" {
				victim = c.others(lead)[0]
			}
			injected := errors.New("injected fsync failure, once")
			c.stores[victim].failOnce(injected)
			if err := c.nodes[lead].Propose(testCtx(t), []byte("doomed")); err != nil && !errors.Is(err, ErrStopped) {
				t.Fatalf("Propose: %v", err)
			}
			n := c.nodes[victim]
			waitDone(t, "the "+role+" to stop after its Save failed", n.Done())
			if !c.stores[victim].hasFailed() {
				t.Fatal("the node stopped but its store never returned the error")
			}
			if err := n.Err(); !errors.Is(err, injected) {
				t.Errorf("Err() = %v, want it to wrap %v", err, injected)
			}
			if calls := c.fatals[victim].calls(); len(calls) != 1 || !errors.Is(calls[0], injected) {
				t.Errorf("OnFatal calls = %v, want exactly one wrapping %v", calls, injected)
			}
			// The survivors go on; give the stopped node's goroutines
			// time to show a Save they should not make.
			rest := c.others(victim)
			newLead := c.waitLeader(rest...)
			c.propose(newLead, "after")
			c.waitApplied("after", rest...)
			if k := c.stores[victim].savesAfterFailure(); k != 0 {
				t.Errorf("%d Saves after the one that failed, want none", k)
			}
			if v := c.takeViolations(); len(v) > 0 {
				t.Errorf("sent after a failed Save:\n%v", v)
			}
		})
	}
}

// WaitApplied of an index nothing will reach ends with its context, by
// cancellation and by deadline (DESIGN.md invariant 12), returning the
// context's error; run apart, so that a WaitApplied that ignored ctx
// fails this test instead of hanging the package.
func TestWaitAppliedEndsWithContext(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.waitLeader()
	c.propose(lead, "x")
	c.waitApplied("x", c.ids...)
	for _, id := range c.ids {
		n := c.nodes[id]
		far := n.Status().Applied + 1000
		cctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		dctx, dcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		for _, tc := range []struct {
			ctx  context.Context
			want error
		}{{cctx, context.Canceled}, {dctx, context.DeadlineExceeded}} {
			errc := make(chan error, 1)
			go func() { errc <- n.WaitApplied(tc.ctx, far) }()
			select {
			case err := <-errc:
				if !errors.Is(err, tc.want) {
					t.Errorf("node %d: WaitApplied(%d) = %v, want %v", id, far, err, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("node %d: WaitApplied(%d) still waiting 5 s after its context ended (%v)", id, far, tc.want)
			}
		}
		cancel()
		dcancel()
	}
}
