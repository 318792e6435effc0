package service

import (
	"errors"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// A "gone" answer ends the client's session (its locks are reported lost),
// so it needs the same leadership confirmation as "alive": a leader that
// was deposed without knowing it yet has a stale table, which lacks the
// sessions the new leader opened and holds expiry marks of its own that
// will never commit. Without a confirmation the heartbeat is answered
// NOT_LEADER, for every session of the batch.
func TestHeartbeatGoneNeedsConfirmation(t *testing.T) {
	h := newHarness(t)
	doomed := h.open(time.Second)
	live := h.open(2 * time.Second)
	h.clk.Advance(1500 * time.Millisecond)
	if alive, _, _ := h.heartbeat(live); !alive {
		t.Fatal("healthy heartbeat not acknowledged")
	}
	h.raf.hold = true // the expiry of doomed stays in the log, unapplied
	h.svc.expireDue()
	const unknown = 1 << 40 // opened by a newer leader this one never heard of

	h.raf.readErr = errors.New("deposed")
	for name, id := range map[string]uint64{"unknown": unknown, "expiring": doomed} {
		alive, gone, code, _ := h.svc.Heartbeat(t.Context(), []uint64{id})
		if len(alive) != 0 || len(gone) != 0 || code != lockpb.Code_CODE_NOT_LEADER {
			t.Errorf("%s session at a deposed leader: alive %v gone %v %v, want NOT_LEADER", name, alive, gone, code)
		}
	}

	h.raf.readErr = nil
	alive, gone, code, _ := h.svc.Heartbeat(t.Context(), []uint64{unknown, doomed, live})
	if code != lockpb.Code_CODE_OK || len(alive) != 1 || alive[0] != live || len(gone) != 2 {
		t.Fatalf("confirmed leader: alive %v gone %v %v, want alive [%d] and 2 gone", alive, gone, code, live)
	}
}

// REVOKE of a session this leader does not hold answers NO_SESSION only
// once its leadership is confirmed: a leader deposed without knowing it
// lacks the sessions its successor opened (an operator would be told a live
// session does not exist).
func TestRevokeUnknownNeedsConfirmation(t *testing.T) {
	h := newHarness(t)
	const unknown = 1 << 40 // opened by a newer leader this one never heard of
	h.raf.readErr = errors.New("deposed")
	resp, err := h.svc.Propose(t.Context(), &lockpb.Request{Op: lockpb.Op_OP_REVOKE, Session: unknown})
	if err != nil || resp.GetCode() != lockpb.Code_CODE_NOT_LEADER {
		t.Fatalf("revoke at a deposed leader: %v, %v; want NOT_LEADER", resp, err)
	}
	h.raf.readErr = nil
	resp, err = h.svc.Propose(t.Context(), &lockpb.Request{Op: lockpb.Op_OP_REVOKE, Session: unknown})
	if err != nil || resp.GetCode() != lockpb.Code_CODE_NO_SESSION {
		t.Fatalf("revoke of an unknown session at a confirmed leader: %v, %v; want NO_SESSION", resp, err)
	}
}

// timerEntries counts the heartbeat receipts the leader's timer queue
// holds.
func (h *harness) timerEntries() int {
	h.svc.mu.Lock()
	defer h.svc.mu.Unlock()
	n := 0
	for _, f := range h.svc.timers.byTTL {
		n += len(f.items) - f.head
	}
	return n
}

// A heartbeat batch that names one session many times (a buggy or hostile
// client: a 4 MiB KeepAlive message holds millions of IDs) renews it once:
// the leader keeps one timer entry per receipt time, not one per ID, so
// the batch cannot pin memory for a whole TTL. The session still expires a
// TTL after that heartbeat, not before.
func TestHeartbeatRepeatedIDsKeepOneTimer(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Minute)
	h.clk.Advance(time.Second)
	ids := make([]uint64, 100_000)
	for i := range ids {
		ids[i] = id
	}
	alive, gone, code, _ := h.svc.Heartbeat(t.Context(), ids)
	if code != lockpb.Code_CODE_OK || len(alive) != len(ids) || len(gone) != 0 {
		t.Fatalf("heartbeat: %d alive, %d gone, %v", len(alive), len(gone), code)
	}
	// The open's receipt and this heartbeat's.
	if n := h.timerEntries(); n != 2 {
		t.Fatalf("%d timer entries after one batch of %d repeated IDs, want 2", n, len(ids))
	}
	h.clk.Advance(time.Minute)
	h.svc.expireDue()
	if !h.live(id) {
		t.Fatal("session expired a TTL after the open, though renewed a second later")
	}
	h.clk.Advance(time.Second)
	h.svc.expireDue()
	if h.live(id) {
		t.Fatal("session still live a TTL after its last heartbeat")
	}
}
