package service

import (
	"testing"
	"time"
)

// Review AC (mutation sweep of invariants 1-6).

// TestReviewACNewLeaderGivesFullTTL checks invariant 3's fresh TTL on a new
// leader over its whole length: a session silent through a leaderless
// window lives a full TTL after the new leader is ready, not only at the
// moment it becomes ready (a new leader that took the session's last
// heartbeat as a TTL ago, or timed it on half its TTL, expired it on its
// first scans), and expires once more than that TTL passed.
func TestReviewACNewLeaderGivesFullTTL(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Second)
	h.svc.LeaderLost()
	h.clk.Advance(10 * time.Second)
	h.becomeLeader()
	for _, step := range []time.Duration{time.Millisecond, 500 * time.Millisecond, 498 * time.Millisecond} {
		h.clk.Advance(step)
		h.svc.expireDue()
		if !h.live(id) {
			t.Fatal("expired by a new leader before a full TTL since it was ready")
		}
	}
	h.clk.Advance(time.Millisecond) // exactly a TTL: not more
	h.svc.expireDue()
	if !h.live(id) {
		t.Fatal("expired when exactly a TTL had passed, not more")
	}
	h.clk.Advance(time.Millisecond)
	h.svc.expireDue()
	if h.live(id) {
		t.Fatal("not expired more than a TTL after the new leader was ready")
	}
}

// TestReviewACOldTermUnmarkKeepsNewMarks checks invariants 3 and 4 across a
// leader change: the refusal of an Expire an earlier leadership of this
// replica proposed, reported after a new leadership proposed its own Expire
// of the same session (unmarkExpiring with the old term), must not unmark
// the session. Otherwise a heartbeat would be answered "alive" just before
// the new leadership's Expire commits and ends the session.
func TestReviewACOldTermUnmarkKeepsNewMarks(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Second)
	oldTerm := h.svc.term
	h.svc.LeaderLost()
	h.becomeLeader()
	h.clk.Advance(2 * time.Second)
	h.raf.hold = true
	h.svc.expireDue() // the new leadership's Expire, in the log, not applied
	h.svc.unmarkExpiring(oldTerm, []uint64{id})
	alive, gone, _ := h.heartbeat(id)
	if alive || !gone {
		t.Fatalf("heartbeat while the new term's Expire is in the log: alive=%v gone=%v, want gone", alive, gone)
	}
	h.raf.commitPending()
	if h.live(id) {
		t.Fatal("the new term's Expire did not end the session")
	}
}

// TestReviewACHeartbeatNotRenewedIsNotAlive checks invariant 4 for a
// heartbeat that arrived while its session's expiry was proposed (so it
// renewed nothing) and whose confirmation ends after raft refused that
// Expire (the session is unmarked, still live): it must not be answered
// "alive", since the leader's timer still counts from the session's
// earlier heartbeat and expires it at the next scan.
func TestReviewACHeartbeatNotRenewedIsNotAlive(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Second)
	term := h.svc.term
	h.clk.Advance(2 * time.Second)
	h.setHold(true)
	h.svc.expireDue() // marks id expiring; its Expire is held
	gate := make(chan struct{})
	h.raf.mu.Lock()
	h.raf.readGate = gate
	reads := h.raf.reads
	h.raf.mu.Unlock()
	type answer struct{ alive, gone bool }
	got := make(chan answer, 1)
	go func() {
		alive, gone, _ := h.heartbeat(id)
		got <- answer{alive, gone}
	}()
	waitFor(t, "the heartbeat's confirmation", func() bool {
		h.raf.mu.Lock()
		defer h.raf.mu.Unlock()
		return h.raf.reads == reads+1
	})
	// Raft refuses the Expire: it is not in the log.
	h.raf.mu.Lock()
	h.raf.pending = nil
	h.raf.mu.Unlock()
	h.svc.unmarkExpiring(term, []uint64{id})
	close(gate)
	a := <-got
	if a.alive {
		t.Fatal("a heartbeat that renewed nothing was answered alive")
	}
	h.setHold(false)
	h.svc.expireDue()
	if h.live(id) {
		t.Fatal("the next scan did not expire the session (the test's premise)")
	}
}
