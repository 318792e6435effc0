package raftnode

import (
	"context"
	"errors"
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

// TestResignKeepsAnsweringTransferee: Resign's renewed pick leaves a
// transfer under way alone while its transferee keeps answering, even when
// that has not been within a heartbeat interval (a loaded host), rather
// than switching raft's transfer to the other follower (raft aborts the
// first transfer and starts over). Here MsgTimeoutNow is dropped, so the
// transfer never completes; the transferee is heard from once after the
// first pick and then falls silent, so that at the first renewed pick it
// was heard within the retry period but not within a heartbeat interval.
// The other follower must get no MsgTimeoutNow until raft has abandoned
// the first transfer (an election timeout after it began).
func TestResignKeepsAnsweringTransferee(t *testing.T) {
	const hb = 2 // fresh: heard within 3 ticks; renewed pick every 6 ticks
	c := newClusterWith(t, 3, func(cfg *Config) { cfg.HeartbeatTicks = hb })
	lead := c.settledLeader()

	var (
		mu       sync.Mutex
		firstTo  uint64 // the first transferee
		ticks    int    // ticks since Resign's first pick
		otherAt  = -1   // the tick of the other follower's first MsgTimeoutNow
		stashed  []*raftpb.Message
		stashing bool
	)
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		mu.Lock()
		defer mu.Unlock()
		if m.GetType() == raftpb.MsgTimeoutNow {
			switch {
			case firstTo == 0:
				firstTo = m.GetTo()
				stashing = true
			case m.GetTo() != firstTo && otherAt < 0:
				otherAt = ticks
			}
			return false // the transfer never completes
		}
		if stashing && from == firstTo && m.GetTo() == lead {
			stashed = append(stashed, proto.Clone(m).(*raftpb.Message))
			return false
		}
		return true
	})
	defer c.setHook(nil)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.nodes[lead].Resign(ctx) }()
	c.waitFor("the first pick", func() bool { mu.Lock(); defer mu.Unlock(); return firstTo != 0 })

	tick := func() {
		c.clk.tick()
		time.Sleep(2 * time.Millisecond) // let the nodes handle what it sent
		mu.Lock()
		ticks++
		mu.Unlock()
	}
	// Two ticks bring a heartbeat round; the transferee's answer is the
	// one sign of life the leader gets from it.
	tick()
	tick()
	c.waitFor("the transferee's answer", func() bool { mu.Lock(); defer mu.Unlock(); return len(stashed) > 0 })
	mu.Lock()
	answer := stashed[len(stashed)-1]
	mu.Unlock()
	c.deliver(answer)
	time.Sleep(2 * time.Millisecond)
	// The renewed pick comes 6 ticks after the first, raft abandons the
	// transfer 10 ticks after it began, and the pick after that (tick 12)
	// is free to go to the other follower.
	for range 2 * electionTicks {
		tick()
	}
	mu.Lock()
	at := otherAt
	mu.Unlock()
	if at < 0 {
		t.Fatalf("no transfer to the other follower in %d ticks: Resign's renewed picks did not run", 2*electionTicks+2)
	}
	if at < electionTicks {
		t.Fatalf("the transfer switched to the other follower at tick %d, while raft's transfer to %d (heard from at tick 2) was under way", at, firstTo)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Resign: %v, want context.Canceled", err)
	}
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
	c := newClusterWith(t, 3, func(cfg *Config) { cfg.HeartbeatTicks = hb })
	lead := c.settledLeader()
	fs := c.others(lead)
	lag, ahead := fs[0], fs[1]

	var (
		mu         sync.Mutex
		muteAhead  bool
		resigning  bool
		appsToLag  int // appends to lag since Resign began
		ticks      int // ticks since Resign began
		aheadTNAt  = -1
		lagTimeout bool
	)
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case m.GetType() == raftpb.MsgTimeoutNow:
			if m.GetTo() == ahead && aheadTNAt < 0 {
				aheadTNAt = ticks
			}
			if m.GetTo() == lag {
				lagTimeout = true
			}
			return false // the transfer never completes
		case m.GetTo() == lag && m.GetType() == raftpb.MsgApp:
			if resigning {
				appsToLag++
			}
			return false // lag stays behind
		case from == ahead && m.GetTo() == lead:
			return !muteAhead
		}
		return true
	})
	defer c.setHook(nil)

	c.propose(lead, "y") // committed by lead and ahead only
	c.waitApplied("y", lead, ahead)
	tick := func() {
		c.clk.tick()
		time.Sleep(2 * time.Millisecond) // let the nodes handle what it sent
		mu.Lock()
		ticks++
		mu.Unlock()
	}
	// ahead falls silent for longer than a heartbeat interval: the first
	// pick goes to lag, the only fresh follower, although it is behind.
	mu.Lock()
	muteAhead = true
	mu.Unlock()
	for range 2 * hb {
		tick()
	}
	mu.Lock()
	resigning, ticks = true, 0
	mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.nodes[lead].Resign(ctx) }()
	// With no tick, the only append the leader sends lag is the
	// transfer's catch-up: the first pick was made, and it was lag (ahead,
	// caught up, would have been sent MsgTimeoutNow at once).
	c.waitFor("the transfer's append to the lagging follower", func() bool { mu.Lock(); defer mu.Unlock(); return appsToLag > 0 })
	mu.Lock()
	if aheadTNAt >= 0 {
		mu.Unlock()
		t.Fatalf("the first pick was %d, the follower not heard from within a heartbeat interval; want %d", ahead, lag)
	}
	muteAhead = false
	mu.Unlock()

	for range 2 * electionTicks {
		tick()
	}
	mu.Lock()
	at, lagTN := aheadTNAt, lagTimeout
	mu.Unlock()
	if lagTN {
		t.Fatalf("the lagging follower %d was sent MsgTimeoutNow", lag)
	}
	if at < 0 || at >= electionTicks {
		t.Fatalf("the transfer went to %d (the longer log, answering again) at tick %d; want it at the renewed pick, before raft abandons the transfer to %d at tick %d", ahead, at, lag, electionTicks)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Resign: %v, want context.Canceled", err)
	}
}
