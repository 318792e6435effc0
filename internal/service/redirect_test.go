package service

import (
	"context"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// answeredWithin waits up to d for got's answer; nil if none came.
func answeredWithin(got <-chan *lockpb.Response, d time.Duration) *lockpb.Response {
	select {
	case r := <-got:
		return r
	case <-time.After(d):
		return nil
	}
}

// wantHeld fails the test if got has an answer within 50 ms (what: the
// state in which it must not).
func wantHeld(t *testing.T, got <-chan *lockpb.Response, what string) {
	t.Helper()
	if r := answeredWithin(got, 50*time.Millisecond); r != nil {
		t.Fatalf("answered %s: %v", what, r)
	}
}

// wantNotLeader waits up to 5 s for got's answer (what: when it is due) and
// fails the test unless it is NOT_LEADER naming member hint at addr (0 and
// "": no hint).
func wantNotLeader(t *testing.T, got <-chan *lockpb.Response, hint uint64, addr, what string) {
	t.Helper()
	r := answeredWithin(got, 5*time.Second)
	if r == nil {
		t.Fatalf("no answer %s", what)
	}
	if r.GetCode() != lockpb.Code_CODE_NOT_LEADER || r.GetLeaderHint() != hint || r.GetLeaderAddr() != addr {
		t.Fatalf("answer %s = %v, want NOT_LEADER with hint %d %q", what, r, hint, addr)
	}
}

// A request raft refuses while this leader hands leadership over
// (Node.Close, Resign) is not sent away without a hint: it waits until
// the new leader is known and is answered NOT_LEADER naming it, so the
// client goes straight there instead of to a follower that may still name
// this replica (review of 2026-12-06: a client dialed at one follower took
// 17-19 ms to find the new leader, two retry backoffs).
func TestRefusedDuringTransferNamesNewLeader(t *testing.T) {
	h := newHarness(t)
	h.svc.cfg.LeaderWait = time.Minute // only the new leader ends the wait
	h.svc.cfg.Peers = map[uint64]string{1: "a:1", 2: "b:2", 3: "c:3"}
	id := h.open(time.Minute)
	h.raf.mu.Lock()
	h.raf.refuse, h.raf.transferee = true, 2
	h.raf.mu.Unlock()
	got := h.proposeAsync(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: id, Seq: 1, Name: "a"})
	wantHeld(t, got, "during the transfer, before a new leader was known")
	h.raf.setLeader(0) // voted for the transferee: no leader known yet
	wantHeld(t, got, "between the vote and the new leader's first message")
	h.raf.setLeader(2)
	wantNotLeader(t, got, 2, "b:2", "once the new leader was known")
}

// The wait is bounded: a leader whose transfer does not finish answers
// NOT_LEADER without a hint after LeaderWait.
func TestRefusedDuringTransferWaitIsBounded(t *testing.T) {
	h := newHarness(t)
	h.svc.cfg.LeaderWait = 20 * time.Millisecond
	id := h.open(time.Minute)
	h.raf.mu.Lock()
	h.raf.refuse, h.raf.transferee = true, 2
	h.raf.mu.Unlock()
	r := h.propose(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: id, Seq: 1, Name: "a"})
	if r.GetCode() != lockpb.Code_CODE_NOT_LEADER || r.GetLeaderHint() != 0 {
		t.Fatalf("after LeaderWait with the transfer unfinished: %v, want NOT_LEADER without a hint", r)
	}
}

// A running replica that knows no leader (an election) holds a request
// until one is known, up to LeaderWait, and then names it; without one by
// then it answers NOT_LEADER without a hint, so a caller at a cut-off
// replica moves on.
func TestLeaderlessReplicaWaitsForLeader(t *testing.T) {
	h := newHarness(t)
	h.svc.cfg.LeaderWait = time.Minute
	h.svc.cfg.Peers = map[uint64]string{1: "a:1", 2: "b:2", 3: "c:3"}
	id := h.open(time.Minute)
	h.raf.setLeader(0)
	h.svc.LeaderLost()
	got := h.proposeAsync(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: id, Seq: 1, Name: "a"})
	wantHeld(t, got, "while no leader was known")
	h.raf.setLeader(3)
	wantNotLeader(t, got, 3, "c:3", "once a leader was known")

	h.svc.cfg.LeaderWait = 20 * time.Millisecond
	h.raf.setLeader(0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := h.svc.Propose(ctx, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: id, Seq: 2, Name: "a"})
	if err != nil || r.GetCode() != lockpb.Code_CODE_NOT_LEADER || r.GetLeaderHint() != 0 {
		t.Fatalf("no leader within LeaderWait: %v, %v; want NOT_LEADER without a hint", r, err)
	}
}

// A transfer raft abandons (the transferee never answered) ends the wait
// at once: the replica still leads, so the caller is answered as before
// rather than held for the rest of LeaderWait.
func TestRefusedDuringAbandonedTransferAnswersAtOnce(t *testing.T) {
	h := newHarness(t)
	h.svc.cfg.LeaderWait = time.Minute
	id := h.open(time.Minute)
	h.raf.mu.Lock()
	h.raf.refuse = true
	h.raf.mu.Unlock()
	h.raf.setTransferee(2)
	got := h.proposeAsync(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: id, Seq: 1, Name: "a"})
	wantHeld(t, got, "during the transfer")
	h.raf.setTransferee(0)
	wantNotLeader(t, got, 0, "", "after the transfer was abandoned (LeaderWait is a minute)")
}

// A leadership lost without a transfer (CheckQuorum, a higher term's vote)
// reaches the service (LeaderLost) before raftnode publishes the Status
// naming the new leader: a refused request waits for that Status and is
// sent to the new leader, not away without a hint on the stale one.
func TestRefusedAfterDepositionWaitsForStatus(t *testing.T) {
	h := newHarness(t)
	h.svc.cfg.LeaderWait = time.Minute
	h.svc.cfg.Peers = map[uint64]string{1: "a:1", 2: "b:2", 3: "c:3"}
	h.svc.LeaderLost() // the Status still names this replica
	got := make(chan *lockpb.Response, 1)
	go func() { got <- h.svc.redirect(context.Background()) }()
	wantHeld(t, got, "on the stale Status")
	h.raf.setLeader(3)
	wantNotLeader(t, got, 3, "c:3", "once a leader was known")
}

// A leader not yet ready holds a request up to ReadyWait; if it is then
// deposed and knows no leader, the request waits at most LeaderWait more,
// not the rest of ReadyWait (review AL).
func TestAwaitReadyDeposedLeaderlessWaitsLeaderWait(t *testing.T) {
	h := newHarness(t)
	h.svc.cfg.ReadyWait = time.Minute
	h.svc.cfg.LeaderWait = 20 * time.Millisecond
	id := h.open(time.Minute)
	h.svc.LeaderLost() // still the leader in Status, not ready: UNAVAILABLE
	got := h.proposeAsync(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: id, Seq: 1, Name: "a"})
	wantHeld(t, got, "by a leader not yet ready")
	h.raf.setLeader(0) // deposed, no leader known
	wantNotLeader(t, got, 0, "", "after the deposition (ReadyWait is a minute)")
}
