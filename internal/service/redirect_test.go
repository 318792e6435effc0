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
	if r := answeredWithin(got, 50*time.Millisecond); r != nil {
		t.Fatalf("answered during the transfer, before a new leader was known: %v", r)
	}
	h.raf.setLeader(0) // voted for the transferee: no leader known yet
	if r := answeredWithin(got, 50*time.Millisecond); r != nil {
		t.Fatalf("answered between the vote and the new leader's first message: %v", r)
	}
	h.raf.setLeader(2)
	r := answeredWithin(got, 5*time.Second)
	if r == nil {
		t.Fatal("no answer once the new leader was known")
	}
	if r.GetCode() != lockpb.Code_CODE_NOT_LEADER || r.GetLeaderHint() != 2 || r.GetLeaderAddr() != "b:2" {
		t.Fatalf("answer = %v, want NOT_LEADER naming member 2 at b:2", r)
	}
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
	if r := answeredWithin(got, 50*time.Millisecond); r != nil {
		t.Fatalf("answered while no leader was known: %v", r)
	}
	h.raf.setLeader(3)
	r := answeredWithin(got, 5*time.Second)
	if r == nil || r.GetCode() != lockpb.Code_CODE_NOT_LEADER || r.GetLeaderHint() != 3 || r.GetLeaderAddr() != "c:3" {
		t.Fatalf("answer = %v, want NOT_LEADER naming member 3 at c:3", r)
	}

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
	if r := answeredWithin(got, 50*time.Millisecond); r != nil {
		t.Fatalf("answered during the transfer: %v", r)
	}
	h.raf.setTransferee(0)
	r := answeredWithin(got, 5*time.Second)
	if r == nil {
		t.Fatal("still held after the transfer was abandoned (LeaderWait is a minute)")
	}
	if r.GetCode() != lockpb.Code_CODE_NOT_LEADER {
		t.Fatalf("answer = %v, want NOT_LEADER", r)
	}
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
	if r := answeredWithin(got, 50*time.Millisecond); r != nil {
		t.Fatalf("answered on the stale Status: %v", r)
	}
	h.raf.setLeader(3)
	r := answeredWithin(got, 5*time.Second)
	if r == nil || r.GetCode() != lockpb.Code_CODE_NOT_LEADER || r.GetLeaderHint() != 3 || r.GetLeaderAddr() != "c:3" {
		t.Fatalf("answer = %v, want NOT_LEADER naming member 3 at c:3", r)
	}
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
	if r := answeredWithin(got, 50*time.Millisecond); r != nil {
		t.Fatalf("answered by a leader not yet ready: %v", r)
	}
	h.raf.setLeader(0) // deposed, no leader known
	r := answeredWithin(got, 5*time.Second)
	if r == nil {
		t.Fatal("held for the rest of ReadyWait (a minute) after the deposition")
	}
	if r.GetCode() != lockpb.Code_CODE_NOT_LEADER || r.GetLeaderHint() != 0 {
		t.Fatalf("answer = %v, want NOT_LEADER without a hint", r)
	}
}
