package service

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/raftnode"
	"go.etcd.io/raft/v3/raftpb"
)

// Review X: attacks on the deduplication of opens by open ID around the
// leader's session timers, its entries in flight and its leadership.

// applyPendingOne applies the oldest held entry alone.
func (h *harness) applyPendingOne() {
	h.t.Helper()
	h.raf.mu.Lock()
	if len(h.raf.pending) == 0 {
		h.raf.mu.Unlock()
		h.t.Fatal("no pending entry")
	}
	e := h.raf.pending[0]
	h.raf.pending = h.raf.pending[1:]
	h.raf.mu.Unlock()
	h.svc.Apply([]*raftpb.Entry{e})
}

// loggedRetryOfAbandonedAttempt logs a straggler attempt of open openID
// whose caller gave up (its nonce marked abandoned) and, behind it, a
// retry through Propose that the table cannot answer yet (the straggler's
// entry has not applied, and no entry of this leadership is in flight for
// openID): both entries are pending. It returns the retry's answer.
func (h *harness) loggedRetryOfAbandonedAttempt(openID uint64) <-chan *lockpb.Response {
	h.t.Helper()
	h.setHold(true)
	h.svc.mu.Lock()
	h.svc.abandonedOpens[4242] = struct{}{}
	h.svc.mu.Unlock()
	h.logOpen(openID, 4242, time.Hour)
	retry := h.proposeAsync(openReq(openID, time.Hour))
	waitFor(h.t, "the retry's own entry", func() bool { return h.pendingEntries() == 2 })
	return retry
}

// A retry whose own entry finds the session of an abandoned attempt must
// restart its timer: the abandoned attempt's apply marked the session to
// expire at the next scan, and the retry's client now holds it
// (invariant 3). Kills the removal of the timer restart (touch) in Apply's reopened case
// (the other tests reach it only through the table's answer or a joined
// entry).
func TestReviewXLoggedRetryKeepsAbandonedAttemptsSession(t *testing.T) {
	h := newHarness(t)
	retry := h.loggedRetryOfAbandonedAttempt(21)
	h.applyPendingOne() // the straggler: creates the session, marked to expire
	h.applyPendingOne() // the retry: finds it
	var r *lockpb.Response
	select {
	case r = <-retry:
	case <-time.After(5 * time.Second):
		t.Fatal("the retry was not answered")
	}
	if r.GetCode() != lockpb.Code_CODE_OK || r.GetSession() == 0 {
		t.Fatalf("retry: %v", r)
	}
	h.setHold(false)
	h.scanKeeps(t, r.GetSession(), "the session the retry received was expired as abandoned")
}

// The same with the scan between the two applies: the session's Expire is
// proposed when the retry's entry applies, so Propose answers the retry
// UNAVAILABLE, never with the session the Expire ends (invariant 3; the
// fsm test only checks the outcome's mark, not Propose's answer).
func TestReviewXLoggedRetryOfExpiringSessionAnswersUnavailable(t *testing.T) {
	h := newHarness(t)
	retry := h.loggedRetryOfAbandonedAttempt(22)
	h.applyPendingOne() // the straggler
	h.clk.Advance(time.Millisecond)
	h.svc.expireDue() // the Expire, held behind the retry
	h.applyPendingOne()
	select {
	case r := <-retry:
		if r.GetCode() != lockpb.Code_CODE_UNAVAILABLE {
			t.Fatalf("retry logged before the Expire: %v, want UNAVAILABLE", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the retry was not answered")
	}
}

// failingRaft is fakeRaft whose ProposeAsync fails (raft never took the
// entry: the proposer's ctx ended first, or the node stopped) while fail
// is set.
type failingRaft struct {
	*fakeRaft
	mu   sync.Mutex
	fail bool
}

func (r *failingRaft) ProposeAsync(ctx context.Context, p raftnode.AsyncProposal) error {
	r.mu.Lock()
	fail := r.fail
	r.mu.Unlock()
	if fail {
		return errors.New("not taken")
	}
	return r.fakeRaft.ProposeAsync(ctx, p)
}

// An open whose entry raft never took is forgotten: the next attempt
// proposes its own entry instead of waiting for one that never applies
// (until its ctx ends, attempt after attempt, until a leader change).
func TestReviewXOpenNotTakenIsForgotten(t *testing.T) {
	h := newHarness(t)
	fr := &failingRaft{fakeRaft: h.raf, fail: true}
	h.svc.Bind(fr)
	if r := h.propose(openReq(23, time.Hour)); r.GetCode() != lockpb.Code_CODE_NOT_LEADER {
		t.Fatalf("open whose entry raft did not take: %v, want NOT_LEADER", r)
	}
	fr.mu.Lock()
	fr.fail = false
	fr.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := h.svc.Propose(ctx, openReq(23, time.Hour))
	if err != nil || r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("the next attempt: %v, %v; want a session", r, err)
	}
}

// An open in flight when leadership is lost is forgotten with it: when
// this replica leads again (its entry lost with the old term), a retry
// proposes its own entry instead of waiting for the lost one.
func TestReviewXOpenInFlightForgottenOnLeaderLoss(t *testing.T) {
	h := newHarness(t)
	h.setHold(true)
	first := h.proposeAsync(openReq(24, time.Hour))
	waitFor(t, "the first attempt's entry", func() bool { return h.pendingEntries() == 1 })
	h.svc.LeaderLost()
	select {
	case r := <-first:
		if r.GetCode() != lockpb.Code_CODE_NOT_LEADER {
			t.Fatalf("first attempt after the leadership loss: %v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first attempt was not answered on leadership loss")
	}
	h.raf.mu.Lock()
	h.raf.pending = nil // overwritten by the next leader's log
	h.raf.mu.Unlock()
	h.setHold(false)
	h.becomeLeader()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := h.svc.Propose(ctx, openReq(24, time.Hour))
	if err != nil || r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("retry at the next leadership: %v, %v; want a session", r, err)
	}
}

// A retry whose leadership confirmation completes in a later term of this
// replica (leadership lost and regained meanwhile) is answered
// NOT_LEADER, as a heartbeat is: the marks of the earlier leadership
// (an expiry it proposed) were dropped with it, so the table's answer is
// not checked against them.
func TestReviewXRetryConfirmedAcrossTermsAnswersNotLeader(t *testing.T) {
	h := newHarness(t)
	h.propose(openReq(26, time.Hour))
	gate := make(chan struct{})
	h.raf.mu.Lock()
	h.raf.readGate = gate
	reads := h.raf.reads
	h.raf.mu.Unlock()
	retry := h.proposeAsync(openReq(26, time.Hour))
	waitFor(t, "the retry's confirmation", func() bool {
		h.raf.mu.Lock()
		defer h.raf.mu.Unlock()
		return h.raf.reads == reads+1
	})
	h.svc.LeaderLost()
	h.becomeLeader()
	close(gate)
	if r := <-retry; r.GetCode() != lockpb.Code_CODE_NOT_LEADER {
		t.Fatalf("retry confirmed across a term change: %v, want NOT_LEADER", r)
	}
}

// An entry of the same open ID that is not the one this leadership has in
// flight (a straggler of an earlier attempt, here one the table refuses)
// does not make the leader forget its own: a retry still waits for that
// entry instead of logging another.
func TestReviewXStragglerKeepsOpenInFlight(t *testing.T) {
	h := newHarness(t)
	h.setHold(true)
	h.logOpen(27, 999, 2*time.Hour) // above MaxTTL: refused when applied
	first := h.proposeAsync(openReq(27, time.Hour))
	waitFor(t, "the first attempt's entry", func() bool { return h.pendingEntries() == 2 })
	h.applyPendingOne() // the straggler
	retry := h.proposeAsync(openReq(27, time.Hour))
	waitFor(t, "the retry to join or log", func() bool {
		if h.pendingEntries() > 1 {
			return true
		}
		return h.twoWaitOnOneRequest()
	})
	if n := h.pendingEntries(); n != 1 {
		t.Fatalf("%d entries pending after the retry, want the first attempt's alone", n)
	}
	h.setHold(false)
	h.raf.commitPending()
	a, b := <-first, <-retry
	if a.GetCode() != lockpb.Code_CODE_OK || b.GetSession() != a.GetSession() {
		t.Fatalf("first attempt %v, retry %v: want one session", a, b)
	}
}

// An open of the same open ID with another TTL (no retry of the same
// NewSession call: a forged or colliding open ID) does not wait for the
// entry in flight, whose session has the other TTL and would end before
// the lease its client counts (invariant 5): it is logged, and the table
// refuses it (CodeInvalid), as it refuses it once the session is live.
// Before, it joined the entry and was answered with that session.
func TestReviewXOtherTTLDoesNotJoinOpenInFlight(t *testing.T) {
	h := newHarness(t)
	h.setHold(true)
	first := h.proposeAsync(openReq(28, 10*time.Second))
	waitFor(t, "the first attempt's entry", func() bool { return h.pendingEntries() == 1 })
	other := h.proposeAsync(openReq(28, time.Hour))
	waitFor(t, "the other open's entry", func() bool { return h.pendingEntries() == 2 })
	h.setHold(false)
	h.raf.commitPending()
	if r := <-first; r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("first open: %v", r)
	}
	if r := <-other; r.GetCode() != lockpb.Code_CODE_INVALID {
		t.Fatalf("open of the same ID with another TTL: %v, want INVALID", r)
	}
	h.svc.mu.Lock()
	left := len(h.svc.openInFlight)
	h.svc.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d opens in flight left", left)
	}
}

// A follower that installed a snapshot and then leads answers a retried
// open from the restored table: the open IDs are part of the image, so
// the retry gets the session the earlier leader opened, logging nothing.
func TestReviewXSnapshotInstalledLeaderAnswersRetry(t *testing.T) {
	a := newHarness(t)
	id := a.propose(openReq(29, time.Hour)).GetSession()
	index, write := a.svc.Snapshot()
	var img bytes.Buffer
	if err := write(&img); err != nil {
		t.Fatal(err)
	}
	b := newHarness(t)
	b.raf.mu.Lock()
	b.raf.index = index
	b.raf.mu.Unlock()
	if err := b.svc.Restore(index, img.Bytes()); err != nil {
		t.Fatal(err)
	}
	b.becomeLeader()
	b.raf.mu.Lock()
	before := b.raf.index
	b.raf.mu.Unlock()
	if r := b.propose(openReq(29, time.Hour)); r.GetCode() != lockpb.Code_CODE_OK || r.GetSession() != id {
		t.Fatalf("retry at the leader that installed the snapshot: %v, want session %d", r, id)
	}
	b.raf.mu.Lock()
	after := b.raf.index
	b.raf.mu.Unlock()
	if after != before {
		t.Fatalf("the retry logged %d entries", after-before)
	}
}
