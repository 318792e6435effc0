package raftnode

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/clock"
)

// appCounter counts the appends a leader sends its followers, with and
// without entries (commit notices), from the moment it is installed.
type appCounter struct {
	mu          sync.Mutex
	full, empty int
}

func (a *appCounter) hook(lead uint64) hookFunc {
	return func(from uint64, m *raftpb.Message) bool {
		if from == lead && m.GetType() == raftpb.MessageType_MsgApp {
			a.mu.Lock()
			if len(m.GetEntries()) > 0 {
				a.full++
			} else {
				a.empty++
			}
			a.mu.Unlock()
		}
		return true
	}
}

func (a *appCounter) counts() (full, empty int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.full, a.empty
}

// With CommitNoticeHold set, the leader holds the empty append raft sends
// after a commit, the next append tells the followers of the commit, and
// the notice held last goes out when the hold runs out on the node's
// clock. No tick runs meanwhile, so no heartbeat tells a follower of a
// commit: what it applies, it learned from an append. (That an append
// with entries drops the notice held for its follower, rather than the
// next notice replacing it, is TestHeldNoticesDroppedWithLeadership's.)
func TestCommitNoticeHold(t *testing.T) {
	const hold = testTick / 2
	c := newClusterWith(t, 3, func(cfg *Config) { cfg.CommitNoticeHold = hold })
	lead := c.settledLeader()
	followers := c.others(lead)
	// settledLeader ended on a tick; the clock is now left alone until
	// the hold, which ends before the next tick, is to run out.
	var a appCounter
	c.setHook(a.hook(lead))

	applied := func(d string, ids ...uint64) func() bool {
		return func() bool {
			for _, id := range ids {
				if c.sms[id].indexOf(d) == 0 {
					return false
				}
			}
			return true
		}
	}
	c.propose(lead, "a")
	c.waitFor(`"a" applied on the leader`, applied("a", lead))
	c.propose(lead, "b") // its appends carry "a"'s commit index
	c.waitFor(`"b" applied on the leader`, applied("b", lead))
	c.waitFor(`"a" applied on the followers`, applied("a", followers...))
	// "b"'s notices are held: the followers have not heard of its commit.
	time.Sleep(20 * time.Millisecond)
	for _, f := range followers {
		if c.sms[f].indexOf("b") != 0 {
			t.Fatalf("follower %d applied \"b\" before the hold ran out", f)
		}
	}
	if full, empty := a.counts(); full != 4 || empty != 0 {
		t.Fatalf("before the hold ran out: %d appends with entries, %d without; want 4 and 0 (every notice held)", full, empty)
	}

	c.clk.Advance(hold)
	c.waitFor(`"b" applied on the followers`, applied("b", followers...))
	if full, empty := a.counts(); full != 4 || empty != 2 {
		t.Fatalf("after the hold: %d appends with entries, %d without; want 4 and 2 (one notice per follower)", full, empty)
	}
}

// Without a hold (the default), a follower learns of a commit from the
// notice raft sends at once: it applies an entry with no tick and no
// later append.
func TestCommitNoticeSentAtOnceByDefault(t *testing.T) {
	c := newCluster(t, 3)
	lead := c.settledLeader()
	var a appCounter
	c.setHook(a.hook(lead))
	c.propose(lead, "a")
	c.waitFor(`"a" applied on the followers`, func() bool {
		for _, f := range c.others(lead) {
			if c.sms[f].indexOf("a") == 0 {
				return false
			}
		}
		return true
	})
	if full, empty := a.counts(); full < 2 || empty < 2 {
		t.Fatalf("%d appends with entries, %d without; want a notice per follower after its append", full, empty)
	}
}

// A leader that steps down drops the notices it holds: none of its term
// goes out when the hold runs out. The hold here outlasts the election
// that deposes it.
func TestHeldNoticesDroppedOnStepDown(t *testing.T) {
	const hold = 100 * testTick
	c := newClusterWith(t, 3, func(cfg *Config) { cfg.CommitNoticeHold = hold })
	lead := c.settledLeader()
	term := c.nodes[lead].Status().Term
	c.propose(lead, "a")
	c.waitFor(`"a" applied on the leader`, func() bool { return c.sms[lead].indexOf("a") != 0 })
	// "a"'s notices are held. Depose the leader: cut off, it steps down
	// (CheckQuorum) while the others elect one of them.
	c.isolate(lead)
	c.tickUntil("a leader among the others, the old one deposed", func() bool {
		return c.leaderAmong(c.others(lead)) != 0 && c.nodes[lead].Status().State != raft.StateLeader
	})
	var mu sync.Mutex
	var late []string
	c.setHook(func(from uint64, m *raftpb.Message) bool {
		if from == lead && m.GetType() == raftpb.MessageType_MsgApp && m.GetTerm() == term {
			mu.Lock()
			late = append(late, fmt.Sprintf("to %d, commit %d", m.GetTo(), m.GetCommit()))
			mu.Unlock()
		}
		return true
	})
	c.heal()
	c.clk.Advance(hold)
	c.waitLeader() // the old leader hears of the new term, and follows
	time.Sleep(20 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(late) > 0 {
		t.Fatalf("the deposed leader sent appends of its term %d after the hold ran out: %v", term, late)
	}
}

// Held notices go when the node stops leading (dropNotices), and so does
// the timer that would have sent them: nothing held is sent late.
func TestHeldNoticesDroppedWithLeadership(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_000_000, 0))
	var sent []*raftpb.Message
	n := &Node{
		cfg:     Config{CommitNoticeHold: time.Millisecond, Transport: recordingTransport(func(m []*raftpb.Message) { sent = append(sent, m...) })},
		clk:     clk,
		noticec: make(chan struct{}, 1),
		notices: make(map[uint64]*raftpb.Message),
	}
	app := func(to uint64, entries int) *raftpb.Message {
		m := &raftpb.Message{Type: raftpb.MessageType_MsgApp.Enum(), To: new(to)}
		for range entries {
			m.Entries = append(m.Entries, &raftpb.Entry{})
		}
		return m
	}
	vote := &raftpb.Message{Type: raftpb.MessageType_MsgVote.Enum(), To: new(uint64(3))}
	in := []*raftpb.Message{app(2, 1), app(2, 0), vote, app(3, 0), app(3, 1)}
	out := n.holdNotices(in)
	// 2's notice came after its append (held); 3's append replaced its
	// notice.
	if len(out) != 3 || out[0] != in[0] || out[1] != vote || out[2] != in[4] {
		t.Fatalf("sent now: %v; want the appends with entries and the vote, in order", out)
	}
	if len(n.notices) != 1 || n.notices[2] != in[1] {
		t.Fatalf("held: %v; want 2's notice", n.notices)
	}
	if clk.Pending() != 1 {
		t.Fatalf("%d timers armed, want the hold's", clk.Pending())
	}
	n.noticec <- struct{}{} // as if a timer had fired and not been handled yet
	n.dropNotices()
	if clk.Pending() != 0 || len(n.notices) != 0 || len(n.noticec) != 0 {
		t.Fatalf("after the drop: %d timers armed, %d notices held, %d signals pending; want none", clk.Pending(), len(n.notices), len(n.noticec))
	}
	n.sendNotices() // as if a signal had come in after the drop anyway
	if len(sent) != 0 {
		t.Fatalf("sent %v after the notices were dropped", sent)
	}

	// Held again, then the hold runs out: sent.
	n.holdNotices([]*raftpb.Message{app(2, 0)})
	clk.Advance(time.Millisecond)
	select {
	case <-n.noticec:
		n.sendNotices()
	case <-time.After(waitTimeout):
		t.Fatal("the hold ran out and its timer did not fire")
	}
	if len(sent) != 1 || sent[0].GetTo() != 2 || len(n.notices) != 0 {
		t.Fatalf("after the hold: sent %v, still held %v; want 2's notice sent", sent, n.notices)
	}
}
