package raftnode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestResignSkipsJustCrashedVoter: a follower that went down less than an
// election timeout ago is still RecentActive in raft (cleared only at the
// next CheckQuorum), but its broken connection (ReportUnreachable) rules it
// out: with an equal log and the lower ID it would otherwise be picked, the
// transfer would go nowhere and proposals would be refused until raft
// abandoned it. (Found by review.)
func TestResignSkipsJustCrashedVoter(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	fs := c.others(lead) // ascending: the lower ID wins a tie
	down, up := fs[0], fs[1]

	c.isolate(down)                       // it crashed: nothing reaches it or comes from it
	c.nodes[lead].ReportUnreachable(down) // its stream broke
	time.Sleep(5 * time.Millisecond)

	// No tick passes: the transfer needs none (the transferee is caught
	// up), and with the test's 10-tick election timeout raft would abandon
	// a transfer that the race detector slowed past it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := c.nodes[lead].Resign(ctx)
	if err != nil {
		t.Fatalf("Resign with voter %d up and voter %d down since a moment: %v; want a hand-over to %d", up, down, err, up)
	}
	if st := c.nodes[lead].Status(); st.Leader != up {
		t.Fatalf("after Resign the old leader follows %d; want %d", st.Leader, up)
	}
	c.waitFor("the transferee to report itself leader", func() bool { return c.nodes[up].Status().State == raft.StateLeader })
}

// TestResignRightAfterCheckQuorum: raft's RecentActive is cleared for
// every follower by each CheckQuorum and set again only when their next
// answers arrive, one round trip later; Resign must still find a
// transferee in that window in a healthy cluster. Here answers to the
// leader take one tick (RTT < tick); Resign is called after each tick,
// with the transfer itself kept from finishing (MsgTimeoutNow dropped) so
// the test can call it again. (Found by review.)
func TestResignRightAfterCheckQuorum(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()

	var mu sync.Mutex
	var held []*raftpb.Message
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		if m.GetType() == raftpb.MsgTimeoutNow {
			return false
		}
		if m.GetTo() == lead && from != lead {
			mu.Lock()
			held = append(held, proto.Clone(m).(*raftpb.Message))
			mu.Unlock()
			return false
		}
		return true
	})
	defer c.setHook(nil)
	for i := range 3 * electionTicks {
		mu.Lock()
		ms := held
		held = nil
		mu.Unlock()
		for _, m := range ms {
			c.deliver(m)
		}
		time.Sleep(2 * time.Millisecond)
		c.clk.tick()
		time.Sleep(2 * time.Millisecond)
		if st := c.nodes[lead].Status(); st.State != raft.StateLeader {
			t.Fatalf("tick %d: %d lost leadership (%v)", i, lead, st.State)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
		err := c.nodes[lead].Resign(ctx)
		cancel()
		if errors.Is(err, ErrNoTransferee) {
			t.Fatalf("tick %d: Resign: %v, although both followers answered within the last tick", i, err)
		}
	}
}

// TestResignRetriesSilentTransferee: a follower that crashed an instant
// before Resign, with no broken connection reported yet, may be picked (it
// answered the last heartbeat, has an equal log and the lower ID); once it
// has missed a few heartbeats Resign picks again, and the live follower
// takes over.
func TestResignRetriesSilentTransferee(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	fs := c.others(lead) // ascending: the lower ID wins a tie
	down, up := fs[0], fs[1]

	// Both followers must have acknowledged the leader's last entry (equal
	// match: the tie goes to down) before down crashes: an entry, each
	// follower's acknowledgement of it seen on the wire, then a ReadIndex
	// round, which the leader's loop serves after the acknowledgements
	// queued before it.
	var acked sync.Map
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		if m.GetTo() == lead && m.GetType() == raftpb.MessageType_MsgAppResp && !m.GetReject() {
			acked.Store(from, m.GetIndex())
		}
		return true
	})
	c.propose(lead, "before the crash")
	c.waitApplied("before the crash", lead)
	last := c.sms[lead].indexOf("before the crash")
	c.tickUntil("both followers acknowledge the last entry", func() bool {
		for _, id := range fs {
			if i, ok := acked.Load(id); !ok || i.(uint64) < last {
				return false
			}
		}
		return true
	})
	if _, err := c.nodes[lead].ReadIndex(testCtx(t)); err != nil {
		t.Fatalf("ReadIndex: %v", err)
	}

	var timeoutNowToDown atomic.Bool
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		if from == down || m.GetTo() == down {
			if m.GetType() == raftpb.MessageType_MsgTimeoutNow {
				timeoutNowToDown.Store(true)
			}
			return false // it crashed
		}
		return true
	})
	defer c.setHook(nil)
	done := make(chan error, 1)
	go func() { done <- c.nodes[lead].Resign(testCtx(t)) }()
	c.waitFor("the first pick, the crashed follower", timeoutNowToDown.Load)
	stop := c.tickInBackground()
	defer stop()
	if err := <-done; err != nil {
		t.Fatalf("Resign: %v", err)
	}
	if st := c.nodes[lead].Status(); st.Leader != up {
		t.Fatalf("after Resign the old leader follows %d; want the live follower %d", st.Leader, up)
	}
}

// TestResignRetriesOnConfiguredClock: Resign's renewed pick (every
// 2×HeartbeatTicks+2 ticks without a new leader) runs on Config.Clock, as
// every other timer of the node does. Here the transfer never completes
// (MsgTimeoutNow dropped), raft abandons it after an election timeout (10
// ticks), and the next renewed pick, at tick 12, starts a second one: the
// manual clock moves 20 ticks in a few milliseconds of real time, far
// less than the 400 ms interval a wall-clock retry waited.
func TestResignRetriesOnConfiguredClock(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	var sent atomic.Int32
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		if m.GetType() == raftpb.MsgTimeoutNow {
			sent.Add(1)
			return false // the transfer never completes
		}
		return true
	})
	defer c.setHook(nil)

	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- c.nodes[lead].Resign(ctx) }()
	for sent.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	for i := 0; i < 20 && sent.Load() < 2; i++ {
		c.clk.tick()
	}
	if n := sent.Load(); n < 2 {
		t.Fatalf("%d transfers started in 20 ticks of the manual clock; want a renewed one after raft abandoned the first", n)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Resign: %v, want context.Canceled", err)
	}
}

// transferWatch runs a leader's Resign on the manual clock and controls
// what the transfer sees: MsgTimeoutNow is dropped (no transfer completes)
// unless passTimeoutNow is set, a muted follower's messages to the leader
// are held back (its silence grows), and appends to a follower marked
// behind are dropped (it cannot catch up).
type transferWatch struct {
	t    *testing.T
	c    *cluster
	lead uint64

	mu             sync.Mutex
	passTimeoutNow bool
	timeoutNowTo   map[uint64]bool // who was sent MsgTimeoutNow
	muted          map[uint64][]*raftpb.Message
	behind         map[uint64]bool

	done chan error // Resign's result
}

func newTransferWatch(t *testing.T, heartbeatTicks int) *transferWatch {
	c := newClusterWith(t, 3, func(cfg *Config) { cfg.HeartbeatTicks = heartbeatTicks })
	w := &transferWatch{t: t, c: c, lead: c.settledLeader(), timeoutNowTo: make(map[uint64]bool), muted: make(map[uint64][]*raftpb.Message), behind: make(map[uint64]bool)}
	c.setHook(w.hook)
	t.Cleanup(func() { c.setHook(nil) })
	return w
}

func (w *transferWatch) hook(from uint64, m *raftpb.Message) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case m.GetType() == raftpb.MsgTimeoutNow:
		w.timeoutNowTo[m.GetTo()] = true
		return w.passTimeoutNow
	case m.GetType() == raftpb.MsgApp && w.behind[m.GetTo()]:
		return false
	case m.GetTo() == w.lead && w.muted[from] != nil:
		w.muted[from] = append(w.muted[from], proto.Clone(m).(*raftpb.Message))
		return false
	}
	return true
}

// fallBehind leaves both followers one entry behind the leader, with equal
// logs: an entry is appended on the leader alone.
func (w *transferWatch) fallBehind() {
	w.mu.Lock()
	for _, id := range w.c.others(w.lead) {
		w.behind[id] = true
	}
	w.mu.Unlock()
	w.c.propose(w.lead, "behind")
	w.c.waitFor("the leader's save of its entry", func() bool { return w.c.stores[w.lead].indexOf("behind") != 0 })
}

func (w *transferWatch) mute(id uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.muted[id] = []*raftpb.Message{}
}

// oneWord delivers the latest held message of muted follower id, which
// stays muted: the leader hears from it once more.
func (w *transferWatch) oneWord(id uint64) {
	w.c.waitFor(fmt.Sprintf("a message from %d", id), func() bool { w.mu.Lock(); defer w.mu.Unlock(); return len(w.muted[id]) > 0 })
	w.mu.Lock()
	m := w.muted[id][len(w.muted[id])-1]
	w.muted[id] = w.muted[id][:0]
	w.mu.Unlock()
	w.c.deliver(m)
	time.Sleep(2 * time.Millisecond)
}

// resign starts Resign and returns the first transferee.
func (w *transferWatch) resign() uint64 {
	ctx, cancel := context.WithCancel(context.Background())
	w.done = make(chan error, 1)
	w.t.Cleanup(cancel)
	go func() { w.done <- w.c.nodes[w.lead].Resign(ctx) }()
	var first uint64
	w.c.waitFor("the first pick", func() bool { first = w.transferee(); return first != 0 })
	return first
}

func (w *transferWatch) transferee() uint64 { return w.c.nodes[w.lead].Status().LeadTransferee }

func (w *transferWatch) tick() {
	w.c.clk.tick()
	time.Sleep(2 * time.Millisecond) // let the nodes handle what it sent
}

func (w *transferWatch) other(id uint64) uint64 {
	for _, o := range w.c.others(w.lead) {
		if o != id {
			return o
		}
	}
	return 0
}

// TestResignKeepsCatchingUpTransferee: Resign's renewed pick leaves a
// transfer alone while its transferee is being caught up and has answered
// within the retry period, even when not within a heartbeat interval (a
// loaded host), and the other follower's log is no longer: switching
// makes raft abort the transfer and start over. Both followers are one
// entry behind and stay so; the transferee is heard from once after the
// pick (tick 2) and then falls silent, the other answers every heartbeat.
// With HeartbeatTicks 2 the renewed pick comes at tick 6 (silence 4: not
// fresh, within the period); raft abandons the transfer at tick 10.
func TestResignKeepsCatchingUpTransferee(t *testing.T) {
	w := newTransferWatch(t, 2)
	w.fallBehind()
	for _, id := range w.c.others(w.lead) {
		w.mute(id) // both, so that neither is fresher at the first pick
	}
	first := w.resign()
	w.mu.Lock()
	delete(w.muted, w.other(first))
	w.mu.Unlock()
	w.tick()
	w.tick()
	w.oneWord(first)
	for i := 3; i < electionTicks; i++ {
		w.tick()
		if got := w.transferee(); got != first {
			t.Fatalf("tick %d: the transfer went to %d, while %d, heard from at tick 2 and as far along, was being caught up", i, got, first)
		}
	}
}

// TestResignSwitchesFromSilentTransferee: a transferee being caught up
// that has not been heard from for a whole retry period is replaced (it may
// have crashed without the transport noticing). HeartbeatTicks 1: renewed
// picks at ticks 4 and 8; the transferee is heard from once at tick 1, so
// it is kept at tick 4 (silence 3) and replaced at tick 8, before raft
// abandons the transfer at tick 10.
func TestResignSwitchesFromSilentTransferee(t *testing.T) {
	w := newTransferWatch(t, 1)
	w.fallBehind()
	for _, id := range w.c.others(w.lead) {
		w.mute(id)
	}
	first := w.resign()
	other := w.other(first)
	w.mu.Lock()
	delete(w.muted, other)
	w.mu.Unlock()
	w.tick()
	w.oneWord(first)
	switched := -1
	for i := 2; i < electionTicks && switched < 0; i++ {
		w.tick()
		if w.transferee() == other {
			switched = i
		}
	}
	if switched < 0 {
		t.Fatalf("the transfer stayed with %d, silent since tick 1, until raft abandons it at tick %d", first, electionTicks)
	}
	if switched < 6 {
		t.Fatalf("the transfer went to %d at tick %d; want it kept with %d, heard from at tick 1, at the renewed pick of tick 4", other, switched, first)
	}
}

// TestResignReplacesCaughtUpTransferee: a transferee that has caught up
// has been sent MsgTimeoutNow; if it has not taken over by the renewed pick
// (it froze right after a last answer, at tick 2), the pick goes to the
// other follower, and the hand-over completes within an election timeout,
// the time Close gives it. HeartbeatTicks 2: the renewed pick is at tick 6.
// (Found by review: a rule that kept every transferee heard from within
// the retry period let raft abandon this transfer at tick 10, with Close's
// time gone.)
func TestResignReplacesCaughtUpTransferee(t *testing.T) {
	w := newTransferWatch(t, 2)
	for _, id := range w.c.others(w.lead) {
		w.mute(id)
	}
	first := w.resign()
	w.mu.Lock()
	delete(w.muted, w.other(first))
	w.passTimeoutNow = true // the next one, to the other follower, goes through
	w.mu.Unlock()
	w.tick()
	w.tick() // a heartbeat round: the transferee's last answer
	w.oneWord(first)
	for i := 3; i < electionTicks; i++ {
		w.tick()
		select {
		case err := <-w.done:
			if err != nil {
				t.Fatalf("Resign: %v", err)
			}
			if st := w.c.nodes[w.lead].Status(); st.Leader != w.other(first) {
				t.Fatalf("after Resign the old leader follows %d; want %d", st.Leader, w.other(first))
			}
			return
		default:
		}
	}
	t.Fatalf("no hand-over within an election timeout: the transfer stayed with %d, which froze after catching up", first)
}

// TestResignSwitchesFromLaggingTransferee: a transfer under way is left to
// run only while no other pick has a longer log. Here the first pick is a
// follower that lags (its appends are dropped, its heartbeat answers get
// through) because the other, further ahead, has not been heard from for a
// moment; once the other answers again, the renewed pick switches to it
// (raft refuses proposals during the transfer, so the longer log is nearer
// to done), well before raft abandons the first transfer.
func TestResignSwitchesFromLaggingTransferee(t *testing.T) {
	const hb = 2 // fresh: heard within 3 ticks; renewed pick every 6 ticks
	w := newTransferWatch(t, hb)
	fs := w.c.others(w.lead)
	lag, ahead := fs[0], fs[1]
	w.mu.Lock()
	w.behind[lag] = true
	w.mu.Unlock()
	w.c.propose(w.lead, "y") // committed by the leader and ahead only
	w.c.waitApplied("y", w.lead, ahead)

	// ahead falls silent for longer than a heartbeat interval: the first
	// pick goes to lag, the only fresh follower, although it is behind.
	w.mute(ahead)
	for range 2 * hb {
		w.tick()
	}
	if first := w.resign(); first != lag {
		t.Fatalf("the first pick was %d, the follower not heard from within a heartbeat interval; want %d", first, lag)
	}
	w.mu.Lock()
	delete(w.muted, ahead)
	w.mu.Unlock()

	switched := -1
	for i := 1; i < electionTicks && switched < 0; i++ {
		w.tick()
		if w.transferee() == ahead {
			switched = i
		}
	}
	w.mu.Lock()
	lagTN := w.timeoutNowTo[lag]
	w.mu.Unlock()
	if lagTN {
		t.Fatalf("the lagging follower %d was sent MsgTimeoutNow", lag)
	}
	if switched < 0 {
		t.Fatalf("the transfer did not go to %d (the longer log, answering again) before raft abandons the transfer to %d at tick %d", ahead, lag, electionTicks)
	}
}

// TestLeaderChangedSignalsTransfer: LeaderChanged closes when a leadership
// transfer starts on the leader and again when raft abandons it (the
// transferee never answered, an election timeout passed), although the
// leader and term stay the same: the service waits on it while a transfer
// is under way (Service.redirect), and would otherwise miss the abandon.
func TestLeaderChangedSignalsTransfer(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	to := c.others(lead)[0]
	term := c.nodes[lead].Status().Term
	c.setHook(func(from uint64, m *raftpb.Message) bool { return m.GetTo() != to && from != to })
	changed := c.nodes[lead].LeaderChanged()
	c.nodes[lead].TransferLeadership(to)
	c.waitFor("the transfer to start", func() bool { return c.nodes[lead].Status().LeadTransferee == to })
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("LeaderChanged did not close when the transfer started")
	}
	changed = c.nodes[lead].LeaderChanged()
	for range electionTicks + 2 {
		c.clk.tick()
		time.Sleep(200 * time.Microsecond)
	}
	c.waitFor("raft to abandon the transfer", func() bool { return c.nodes[lead].Status().LeadTransferee == 0 })
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("LeaderChanged did not close when raft abandoned the transfer")
	}
	if st := c.nodes[lead].Status(); st.Leader != lead || st.Term != term {
		t.Fatalf("after the abandoned transfer: leader %d term %d, want %d and %d", st.Leader, st.Term, lead, term)
	}
	c.setHook(nil)
}
