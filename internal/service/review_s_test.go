package service

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/raftnode"
)

// Review S: opens carry a client-chosen open ID (lockpb.Request.open_id),
// and a retried open gets the session an earlier attempt opened. These
// tests check the leader's session timers around such retries.

func openReq(openID uint64, ttl time.Duration) *lockpb.Request {
	return &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: ttl.Milliseconds(), OpenId: openID}
}

func (h *harness) setHold(hold bool) {
	h.raf.mu.Lock()
	h.raf.hold = hold
	h.raf.mu.Unlock()
}

// twoWaitOnOneRequest reports whether two callers wait for the answer of
// one request (a retry joined the attempt before it).
func (h *harness) twoWaitOnOneRequest() bool {
	h.svc.mu.Lock()
	defer h.svc.mu.Unlock()
	for _, cs := range h.svc.requests {
		if len(cs) == 2 {
			return true
		}
	}
	return false
}

// scanKeeps runs the leader's expiry scan a moment later and fails the
// test with why if the scan expired session id.
func (h *harness) scanKeeps(t *testing.T, id uint64, why string) {
	t.Helper()
	h.clk.Advance(time.Millisecond)
	h.svc.expireDue()
	if !h.live(id) {
		t.Fatal(why)
	}
}

// abandonOpenAttempt sends an attempt of open openID whose caller gives up
// before its entry applies (raft holds it); the entry stays pending.
func (h *harness) abandonOpenAttempt(openID uint64, ttl time.Duration) {
	h.t.Helper()
	h.setHold(true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := h.svc.Propose(ctx, openReq(openID, ttl)); err == nil {
		h.t.Fatal("an open whose entry never applied returned no error")
	}
}

// A retry of an open whose first attempt was abandoned (the client's
// attempt timed out; the entry applied after, and the leader marked the
// session for expiry as unused) gets that session, and the leader keeps
// it: the retry's client holds it (invariant 3). Before, the session
// expired at the next scan while the client believed in its lease.
func TestReviewSRetryKeepsSessionOfAbandonedAttempt(t *testing.T) {
	h := newHarness(t)
	h.abandonOpenAttempt(7, time.Hour)
	h.setHold(false)
	h.raf.commitPending()
	r := h.propose(openReq(7, time.Hour))
	if r.GetCode() != lockpb.Code_CODE_OK || r.GetSession() == 0 {
		t.Fatalf("retried open: %v", r)
	}
	h.clk.Advance(time.Millisecond)
	h.svc.expireDue()
	if n, _ := h.svc.Counts(); n != 1 || !h.live(r.GetSession()) {
		t.Fatalf("after the next scan: %d sessions, the retry's %d live: %v; want it alone", n, r.GetSession(), h.live(r.GetSession()))
	}
	if alive, _, _ := h.heartbeat(r.GetSession()); !alive {
		t.Fatal("the retry's session is not alive")
	}
}

// logOpen logs an open entry of openID with nonce (as an attempt that
// reached raft by another way than Propose: a straggler, a race), its
// waiter, if any, registered by the caller.
func (h *harness) logOpen(openID, nonce uint64, ttl time.Duration) {
	h.t.Helper()
	cmd := fsm.Command{Op: fsm.OpOpenSession, TTL: int64(ttl), Nonce: nonce, OpenID: openID}
	if err := h.raf.Propose(context.Background(), fsm.Encode(&cmd)); err != nil {
		h.t.Fatal(err)
	}
}

// The same with the attempts' entries in the other order: a late attempt
// (delayed on its way, then abandoned) applies after the retry that was
// answered. It finds the session, and must not have it expired as unused.
// (Propose answers a retry whose session is live without logging it, so
// the late entry is logged directly.)
func TestReviewSLateAbandonedAttemptKeepsAnsweredSession(t *testing.T) {
	h := newHarness(t)
	r := h.propose(openReq(9, time.Hour))
	if r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("open: %v", r)
	}
	h.svc.mu.Lock()
	h.svc.abandonedOpens[777] = struct{}{}
	h.svc.mu.Unlock()
	h.logOpen(9, 777, time.Hour)
	h.clk.Advance(time.Millisecond)
	h.svc.expireDue()
	if n, _ := h.svc.Counts(); n != 1 || !h.live(r.GetSession()) {
		t.Fatalf("after the late attempt and a scan: %d sessions, session %d live: %v", n, r.GetSession(), h.live(r.GetSession()))
	}

	// An answer found in the channel as its caller gave up (abandonOpen's
	// second case) names a session another attempt of the open may hold.
	reqc := make(chan outcome, 1)
	reqc <- outcome{res: fsm.Result{Code: fsm.CodeOK, Session: r.GetSession()}, reopened: true}
	h.svc.abandonOpen(reqKey{0, 12345}, reqc, 9)
	h.scanKeeps(t, r.GetSession(), "an abandoned retry's unread answer expired the session it found")
}

// A retry that arrives while the session's expiry is proposed (the first
// attempt was abandoned and the scan already ran) is answered UNAVAILABLE,
// not with a session the Expire ends; the client's next retry, after the
// Expire, opens a new session.
func TestReviewSRetryOfExpiringSessionRetries(t *testing.T) {
	h := newHarness(t)
	h.abandonOpenAttempt(5, time.Hour)
	h.raf.commitPending() // still holding: later entries stay pending
	h.svc.mu.Lock()
	first := h.svc.m.Sessions()
	h.svc.mu.Unlock()
	if len(first) != 1 {
		t.Fatalf("sessions after the abandoned attempt: %v", first)
	}
	h.clk.Advance(time.Millisecond)
	h.svc.expireDue() // the Expire is proposed, held
	if r := h.propose(openReq(5, time.Hour)); r.GetCode() != lockpb.Code_CODE_UNAVAILABLE {
		t.Fatalf("retry of an expiring session's open: %v, want UNAVAILABLE", r)
	}
	h.setHold(false)
	h.raf.commitPending()
	if h.live(first[0].ID) {
		t.Fatal("the abandoned attempt's session did not expire")
	}
	r := h.propose(openReq(5, time.Hour))
	if r.GetCode() != lockpb.Code_CODE_OK || r.GetSession() == first[0].ID || !h.live(r.GetSession()) {
		t.Fatalf("the next retry: %v", r)
	}
}

// The same when the retry's entry is logged before the Expire is
// proposed and applies after (a race Propose's check does not see): its
// waiter is answered "expiring" (UNAVAILABLE), not with the session.
func TestReviewSLoggedRetryOfExpiringSessionRetries(t *testing.T) {
	h := newHarness(t)
	id := h.propose(openReq(5, time.Hour)).GetSession()
	h.setHold(true)
	reqc := make(chan outcome, 1)
	h.svc.mu.Lock()
	h.svc.requests[reqKey{0, 888}] = []chan outcome{reqc}
	h.svc.mu.Unlock()
	h.logOpen(5, 888, time.Hour)
	h.svc.mu.Lock()
	h.svc.expireSoon(id)
	h.svc.mu.Unlock()
	h.clk.Advance(time.Millisecond)
	h.svc.expireDue() // the Expire goes behind the retry
	h.setHold(false)
	h.raf.commitPending()
	if o := <-reqc; !o.expiring || !o.reopened {
		t.Fatalf("retry logged before the Expire: %+v, want expiring", o)
	}
	if h.live(id) {
		t.Fatal("the session did not expire")
	}
}

// A retry of an open whose session is live is answered from the table,
// without another entry, after a leadership confirmation issued after it
// arrived; a deposed leader answers NOT_LEADER.
func TestReviewSRetryOfLiveSessionLogsNothing(t *testing.T) {
	h := newHarness(t)
	id := h.propose(openReq(12, time.Hour)).GetSession()
	h.raf.mu.Lock()
	index, reads := h.raf.index, h.raf.reads
	h.raf.mu.Unlock()
	if r := h.propose(openReq(12, time.Hour)); r.GetCode() != lockpb.Code_CODE_OK || r.GetSession() != id {
		t.Fatalf("retry: %v, want session %d", r, id)
	}
	h.raf.mu.Lock()
	index2, reads2 := h.raf.index, h.raf.reads
	h.raf.mu.Unlock()
	if index2 != index || reads2 != reads+1 {
		t.Fatalf("the retry logged %d entries and confirmed leadership %d times, want 0 and 1", index2-index, reads2-reads)
	}
	// Another TTL goes through the log, which refuses it.
	if r := h.propose(openReq(12, 2*time.Hour)); r.GetCode() != lockpb.Code_CODE_INVALID {
		t.Fatalf("retry with another TTL: %v, want INVALID", r)
	}
	h.raf.mu.Lock()
	h.raf.readErr = raftnode.ErrNotLeader
	h.raf.mu.Unlock()
	if r := h.propose(openReq(12, time.Hour)); r.GetCode() != lockpb.Code_CODE_NOT_LEADER {
		t.Fatalf("retry at a leader whose confirmation fails: %v, want NOT_LEADER", r)
	}
}

// A retried open restarts the session's timer: the client's lease counts
// from before the retry was sent (invariant 5), so the leader's expiry
// must not count from the first attempt's apply.
func TestReviewSRetriedOpenRestartsTimer(t *testing.T) {
	h := newHarness(t)
	const ttl = 10 * time.Second
	a := h.propose(openReq(3, ttl))
	h.clk.Advance(8 * time.Second)
	b := h.propose(openReq(3, ttl))
	if a.GetSession() == 0 || b.GetSession() != a.GetSession() {
		t.Fatalf("open %v, retry %v: want one session", a, b)
	}
	if n, _ := h.svc.Counts(); n != 1 {
		t.Fatalf("%d sessions after an open and its retry", n)
	}
	h.clk.Advance(8 * time.Second) // 16 s after the first apply, 8 s after the retry
	h.svc.expireDue()
	if !h.live(a.GetSession()) {
		t.Fatal("expired a TTL after the first attempt, though a retry applied since")
	}
	h.clk.Advance(3 * time.Second)
	h.svc.expireDue()
	if h.live(a.GetSession()) {
		t.Fatal("not expired a TTL after the retry")
	}
}

// Opens without an open ID are not deduplicated, as before.
func TestReviewSOpensWithoutIDAreDistinct(t *testing.T) {
	h := newHarness(t)
	a, b := h.propose(openReq(0, time.Hour)), h.propose(openReq(0, time.Hour))
	if a.GetSession() == 0 || a.GetSession() == b.GetSession() {
		t.Fatalf("two opens without an ID: %v, %v", a, b)
	}
}

// An open on a propose stream answered as its caller cancelled it (the
// answer is never sent) expires the session only without an open ID: with
// one, another attempt of the open may hold the session (here an earlier
// one, answered). Before, the stream expired that one too.
func TestReviewSStreamCancelledRetryKeepsFoundSession(t *testing.T) {
	h := newHarness(t)
	held := h.propose(openReq(21, time.Hour)).GetSession()
	st := streamHarness(t, h)
	answered := make(chan uint64)
	proceed := make(chan struct{})
	// Runs in the call's goroutine after Propose returned, before the
	// stream looks at the call's context.
	h.svc.cfg.Hooks.Request = func(op lockpb.Op, resp *lockpb.Response, err error, _ time.Duration) {
		if op == lockpb.Op_OP_OPEN_SESSION && err == nil && resp.GetCode() == lockpb.Code_CODE_OK {
			answered <- resp.GetSession()
			<-proceed
		}
	}
	// cancelledOpen sends an open of openID on the stream as call id and
	// cancels it once it is answered, before the answer goes out.
	cancelledOpen := func(id, openID uint64) uint64 {
		t.Helper()
		if err := st.Send(&lockpb.ProposeCalls{Calls: []*lockpb.ProposeCall{call(id, openReq(openID, time.Hour))}}); err != nil {
			t.Fatal(err)
		}
		session := <-answered
		// The cancel, then a call answered at once: once its answer is
		// here, the stream has cancelled the open's context.
		if err := st.Send(&lockpb.ProposeCalls{Calls: []*lockpb.ProposeCall{
			{Id: id, Cancel: true}, call(id+1, &lockpb.Request{Op: lockpb.Op(99)}),
		}}); err != nil {
			t.Fatal(err)
		}
		recvReplies(t, st, id+1)
		proceed <- struct{}{}
		return session
	}
	// expiredWithin reports whether session id ends within d of scans.
	expiredWithin := func(id uint64, d time.Duration) bool {
		for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			h.clk.Advance(time.Millisecond)
			h.svc.expireDue()
			if !h.live(id) {
				return true
			}
		}
		return false
	}

	// The control: an open without an ID is expired.
	if created := cancelledOpen(1, 0); !expiredWithin(created, 5*time.Second) {
		t.Fatal("the session of a cancelled open without an open ID was not expired")
	}
	if found := cancelledOpen(3, 21); found != held {
		t.Fatalf("the retry found session %d, want %d", found, held)
	}
	if expiredWithin(held, 300*time.Millisecond) {
		t.Fatal("a cancelled retry expired the session an earlier attempt opened")
	}
}

// pendingEntries is the number of entries raft holds (hold mode).
func (h *harness) pendingEntries() int {
	h.raf.mu.Lock()
	defer h.raf.mu.Unlock()
	return len(h.raf.pending)
}

// A retry of an open whose entry the leader proposed and has not applied
// (the client's attempt timed out under load) waits for that entry
// instead of logging another: under overload each retry's entry only
// lengthened the backlog that made the attempts time out (review N saw
// about 32 attempts per session). It gets the session the entry opens,
// which is then not expired as abandoned.
func TestReviewSRetryJoinsPendingOpen(t *testing.T) {
	h := newHarness(t)
	h.abandonOpenAttempt(4, time.Hour)
	if n := h.pendingEntries(); n != 1 {
		t.Fatalf("%d entries pending after the first attempt", n)
	}
	retry := h.proposeAsync(openReq(4, time.Hour))
	waitFor(t, "the retry to wait", func() bool {
		h.svc.mu.Lock()
		defer h.svc.mu.Unlock()
		return len(h.svc.requests) == 1
	})
	if n := h.pendingEntries(); n != 1 {
		t.Fatalf("%d entries pending after the retry, want the first attempt's alone", n)
	}
	h.setHold(false)
	h.raf.commitPending()
	r := <-retry
	if r.GetCode() != lockpb.Code_CODE_OK || r.GetSession() == 0 {
		t.Fatalf("retry: %v", r)
	}
	h.clk.Advance(time.Millisecond)
	h.svc.expireDue()
	if n, _ := h.svc.Counts(); n != 1 || !h.live(r.GetSession()) {
		t.Fatalf("after a scan: %d sessions, the retry's live: %v", n, h.live(r.GetSession()))
	}
	h.svc.mu.Lock()
	left := len(h.svc.openInFlight) + len(h.svc.abandonedOpens)
	h.svc.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d opens still recorded after the apply", left)
	}
	// Once it applied, the next open with the ID gets the same session.
	h.propose(openReq(4, time.Hour))
	if n, _ := h.svc.Counts(); n != 1 {
		t.Fatalf("%d sessions after a later retry", n)
	}
}

// refusingRaft is fakeRaft whose ProposeAsync keeps each entry's Refused
// callback and proposes nothing (refusals come when the test says).
type refusingRaft struct {
	*fakeRaft
	mu      sync.Mutex
	refused []func(error)
}

func (r *refusingRaft) ProposeAsync(ctx context.Context, p raftnode.AsyncProposal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused = append(r.refused, p.Refused)
	return nil
}

func (r *refusingRaft) proposals() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.refused)
}

// When raft refuses an open's entry, the retries that joined it are
// answered NOT_LEADER too (they send the open again), and the entry is
// forgotten: the next attempt proposes its own.
func TestReviewSRefusedOpenAnswersJoinedRetries(t *testing.T) {
	h := newHarness(t)
	rr := &refusingRaft{fakeRaft: h.raf}
	h.svc.Bind(rr)
	first := h.proposeAsync(openReq(6, time.Hour))
	waitFor(t, "the first attempt's proposal", func() bool { return rr.proposals() == 1 })
	retry := h.proposeAsync(openReq(6, time.Hour))
	waitFor(t, "the retry to wait", func() bool {
		return h.twoWaitOnOneRequest()
	})
	if n := rr.proposals(); n != 1 {
		t.Fatalf("%d proposals, want the first attempt's alone", n)
	}
	rr.refused[0](raftnode.ErrNotLeader)
	for _, c := range []<-chan *lockpb.Response{first, retry} {
		select {
		case r := <-c:
			if r.GetCode() != lockpb.Code_CODE_NOT_LEADER {
				t.Fatalf("after the refusal: %v, want NOT_LEADER", r)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("an attempt waiting for the refused entry was not answered")
		}
	}
	h.svc.mu.Lock()
	left := len(h.svc.openInFlight) + len(h.svc.requests)
	h.svc.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d opens or waiters left after the refusal", left)
	}
	h.proposeAsync(openReq(6, time.Hour))
	waitFor(t, "the next attempt's own proposal", func() bool { return rr.proposals() == 2 })
}

// The first attempt's cancel may reach the leader after its retry joined
// the entry (they travel on different streams): the entry still has a
// waiter, so its session is not expired as abandoned.
func TestReviewSJoinedRetryOutlivesFirstAttemptsCancel(t *testing.T) {
	h := newHarness(t)
	h.setHold(true)
	ctx, cancel := context.WithCancel(context.Background())
	firstErr := make(chan error, 1)
	go func() {
		_, err := h.svc.Propose(ctx, openReq(8, time.Hour))
		firstErr <- err
	}()
	waitFor(t, "the first attempt's entry", func() bool { return h.pendingEntries() == 1 })
	retry := h.proposeAsync(openReq(8, time.Hour))
	waitFor(t, "the retry to join", func() bool {
		return h.twoWaitOnOneRequest()
	})
	cancel()
	if err := <-firstErr; err == nil {
		t.Fatal("the cancelled first attempt returned no error")
	}
	h.setHold(false)
	h.raf.commitPending()
	r := <-retry
	if r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("retry: %v", r)
	}
	h.scanKeeps(t, r.GetSession(), "the session the joined retry received was expired as abandoned")
}

// A session whose expiry is proposed while the retry waits for its
// leadership confirmation is not returned: the Expire ends it.
func TestReviewSRetryAnsweredAfterConfirmationSeesExpiry(t *testing.T) {
	h := newHarness(t)
	id := h.propose(openReq(13, time.Hour)).GetSession()
	gate := make(chan struct{})
	h.raf.mu.Lock()
	h.raf.readGate = gate
	reads := h.raf.reads
	h.raf.mu.Unlock()
	retry := h.proposeAsync(openReq(13, time.Hour))
	waitFor(t, "the retry's confirmation", func() bool {
		h.raf.mu.Lock()
		defer h.raf.mu.Unlock()
		return h.raf.reads == reads+1
	})
	h.svc.mu.Lock()
	h.svc.expireSoon(id) // as a revoke or an abandoned open would
	h.svc.mu.Unlock()
	h.setHold(true)
	h.clk.Advance(time.Millisecond)
	h.svc.expireDue()
	close(gate)
	if r := <-retry; r.GetCode() != lockpb.Code_CODE_UNAVAILABLE {
		t.Fatalf("retry of a session expired during its confirmation: %v, want UNAVAILABLE", r)
	}
}
