package service

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/raftnode"
)

// fakeRaft is a single-replica log: a proposal is appended and, unless
// held, applied at once.
type fakeRaft struct {
	applyMu sync.Mutex // held across a proposal's index assignment and apply
	mu      sync.Mutex
	svc     *Service
	index   uint64
	term    uint64
	hold    bool // keep proposals pending
	pending []*raftpb.Entry
	readErr error
	reads   int
	// readGate, if set, holds every ReadIndex (counted in reads at once)
	// until it is closed.
	readGate chan struct{}
	leader   uint64
	changed  chan struct{} // closed and replaced by setLeader
	// transferee is Status().LeadTransferee: a leadership transfer under
	// way (setLeader clears it).
	transferee uint64

	deferredCalls int      // deferred ProposeAsync calls
	holdDeferred  bool     // a deferred ProposeAsync keeps the entry in heldDeferred
	heldDeferred  [][]byte // until proposeHeld
	releases      int      // ReleaseDeferred calls

	last   []byte        // the data of the latest proposal
	refuse bool          // ProposeAsync: raft refuses every entry (not the leader)
	drop   bool          // ProposeAsync: the entry stays queued in a stopping node
	done   chan struct{} // Done (nil: never stops)
	// late: raft takes each entry into the log only after the proposer's
	// ctx ended (a loop busy with a slow fsync): Propose returns ctx's
	// error, ProposeAsync nil (the entry was queued); the entry stays in
	// pending, as with hold.
	late bool
}

// setLeader changes the leader Status reports and signals LeaderChanged,
// as raftnode publishes them together.
func (f *fakeRaft) setLeader(id uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leader, f.transferee = id, 0
	close(f.changed)
	f.changed = make(chan struct{})
}

// setTransferee changes Status().LeadTransferee and signals
// LeaderChanged, as raftnode publishes a transfer's start and end.
func (f *fakeRaft) setTransferee(id uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.transferee = id
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeRaft) LeaderChanged() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

func (f *fakeRaft) Propose(ctx context.Context, data []byte) error {
	// Concurrent proposals apply in index order, as raft applies them.
	f.applyMu.Lock()
	defer f.applyMu.Unlock()
	f.mu.Lock()
	f.index++
	f.last = data
	e := &raftpb.Entry{Index: new(f.index), Term: new(f.term), Type: raftpb.EntryNormal.Enum(), Data: data}
	hold, late := f.hold || f.late, f.late
	if hold {
		f.pending = append(f.pending, e)
	}
	f.mu.Unlock()
	if !hold {
		f.svc.Apply([]*raftpb.Entry{e})
	}
	if late {
		return context.DeadlineExceeded
	}
	return nil
}

// ProposeAsync proposes p.Data as Propose does. A deferred entry is
// counted and, with holdDeferred set, kept in heldDeferred until
// proposeHeld, as raftnode may hold it.
func (f *fakeRaft) ProposeAsync(ctx context.Context, p raftnode.AsyncProposal) error {
	f.mu.Lock()
	refuse, drop, late := f.refuse, f.drop, f.late
	f.mu.Unlock()
	switch {
	case late:
		_ = f.Propose(ctx, p.Data) // queued: in the log later
		return nil
	case refuse:
		// As raftnode does: later, on the node's goroutine.
		go p.Refused(raftnode.ErrNotLeader)
		return nil
	case drop:
		return nil
	}
	if p.Deferred {
		f.mu.Lock()
		f.deferredCalls++
		if f.holdDeferred {
			f.heldDeferred = append(f.heldDeferred, p.Data)
			f.mu.Unlock()
			return nil
		}
		f.mu.Unlock()
	}
	return f.Propose(ctx, p.Data)
}

func (f *fakeRaft) Done() <-chan struct{} { return f.done }

func (f *fakeRaft) DeferEpoch() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return uint64(f.releases)
}

func (f *fakeRaft) ReleaseDeferred() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releases++
}

// proposeHeld proposes the deferred entries held.
func (f *fakeRaft) proposeHeld() {
	f.mu.Lock()
	held := f.heldDeferred
	f.heldDeferred = nil
	f.mu.Unlock()
	for _, d := range held {
		_ = f.Propose(context.Background(), d)
	}
}

// commitPending applies the held entries.
func (f *fakeRaft) commitPending() {
	f.mu.Lock()
	ents := f.pending
	f.pending = nil
	f.mu.Unlock()
	f.svc.Apply(ents)
}

func (f *fakeRaft) ReadIndex(ctx context.Context) (uint64, error) {
	f.mu.Lock()
	f.reads++
	gate := f.readGate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.index, f.readErr
}

func (f *fakeRaft) WaitApplied(ctx context.Context, index uint64) error { return nil }

func (f *fakeRaft) Status() raftnode.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return raftnode.Status{ID: 1, Leader: f.leader, Term: f.term, Commit: f.index, Applied: f.index, LeadTransferee: f.transferee}
}

type harness struct {
	t   *testing.T
	svc *Service
	raf *fakeRaft
	clk *clock.Manual
}

func newHarness(t *testing.T) *harness {
	clk := clock.NewManual(time.Unix(1000, 0))
	svc := New(Config{Clock: clk, Limits: fsm.Limits{MinTTL: int64(time.Second), MaxTTL: int64(time.Hour)}})
	f := &fakeRaft{svc: svc, term: 2, leader: 1, changed: make(chan struct{})}
	svc.Bind(f)
	h := &harness{t: t, svc: svc, raf: f, clk: clk}
	h.becomeLeader()
	return h
}

// becomeLeader applies the new term's first (empty) entry and signals
// LeaderReady, as raftnode does.
func (h *harness) becomeLeader() {
	h.raf.mu.Lock()
	h.raf.term++
	h.raf.index++
	e := &raftpb.Entry{Index: new(h.raf.index), Term: new(h.raf.term), Type: raftpb.EntryNormal.Enum()}
	term := h.raf.term
	h.raf.mu.Unlock()
	h.svc.Apply([]*raftpb.Entry{e})
	h.svc.LeaderReady(term)
}

func (h *harness) propose(req *lockpb.Request) *lockpb.Response {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := h.svc.Propose(ctx, req)
	if err != nil {
		h.t.Fatalf("Propose(%v): %v", req, err)
	}
	return resp
}

// proposeAsync runs Propose in a goroutine; the response arrives on the
// returned channel.
func (h *harness) proposeAsync(req *lockpb.Request) <-chan *lockpb.Response {
	got := make(chan *lockpb.Response, 1)
	go func() {
		resp, err := h.svc.Propose(context.Background(), req)
		if err != nil {
			h.t.Error(err)
		}
		got <- resp
	}()
	return got
}

func (h *harness) open(ttl time.Duration) uint64 {
	h.t.Helper()
	r := h.propose(&lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: ttl.Milliseconds()})
	if r.GetCode() != lockpb.Code_CODE_OK {
		h.t.Fatalf("open: %v", r)
	}
	return r.GetSession()
}

func (h *harness) heartbeat(id uint64) (alive, gone bool, code lockpb.Code) {
	a, g, code, _ := h.svc.Heartbeat(context.Background(), []uint64{id})
	return len(a) == 1, len(g) == 1, code
}

func (h *harness) live(id uint64) bool {
	_, ok := h.svc.SessionTTL(id)
	return ok
}

// An entry raft refuses (this replica stopped leading, a transfer is
// under way) is answered NOT_LEADER at once, so the client moves on to
// the leader, and its waiter is dropped.
func TestRefusedEntryAnswersNotLeader(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Minute)
	h.raf.mu.Lock()
	h.raf.refuse = true
	h.raf.mu.Unlock()
	for seq, op := range []lockpb.Op{lockpb.Op_OP_ACQUIRE, lockpb.Op_OP_RELEASE} {
		r := h.propose(&lockpb.Request{Op: op, Session: id, Seq: uint64(seq + 1), Name: "a"})
		if r.GetCode() != lockpb.Code_CODE_NOT_LEADER {
			t.Fatalf("%v of a refused entry: %v, want NOT_LEADER", op, r)
		}
	}
	h.svc.mu.Lock()
	defer h.svc.mu.Unlock()
	if len(h.svc.requests) != 0 || len(h.svc.grants) != 0 {
		t.Fatalf("waiters left behind: %d requests, %d sessions with grant waiters", len(h.svc.requests), len(h.svc.grants))
	}
}

// An entry still queued when the raft node stops is never applied nor
// refused: its request is answered NOT_LEADER when the node is done.
func TestStoppedNodeAnswersQueuedRequest(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Minute)
	h.raf.mu.Lock()
	h.raf.drop = true
	h.raf.done = make(chan struct{})
	h.raf.mu.Unlock()
	got := h.proposeAsync(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: id, Seq: 1, Name: "a"})
	select {
	case r := <-got:
		t.Fatalf("answered before the node stopped: %v", r)
	case <-time.After(50 * time.Millisecond):
	}
	close(h.raf.done)
	select {
	case r := <-got:
		if r.GetCode() != lockpb.Code_CODE_NOT_LEADER {
			t.Fatalf("after the node stopped: %v, want NOT_LEADER", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a request queued in a stopped node was never answered")
	}
}

// Invariant 4: without a leadership confirmation after its arrival, a
// heartbeat is not acknowledged.
func TestHeartbeatNeedsConfirmation(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Second)
	if alive, _, code := h.heartbeat(id); !alive || code != lockpb.Code_CODE_OK {
		t.Fatalf("healthy heartbeat: alive=%v code=%v", alive, code)
	}
	reads := h.raf.reads
	h.raf.readErr = errors.New("deposed")
	alive, _, code := h.heartbeat(id)
	if alive || code != lockpb.Code_CODE_NOT_LEADER {
		t.Fatalf("heartbeat without confirmation: alive=%v code=%v", alive, code)
	}
	if h.raf.reads != reads+1 {
		t.Fatalf("heartbeat issued %d read index rounds, want 1", h.raf.reads-reads)
	}
}

// Invariant 3: the leader proposes an expiry only once more than the TTL
// has passed since the last heartbeat it received, in its own term.
func TestExpiryAfterTTLSinceLastHeartbeat(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Second)
	h.clk.Advance(600 * time.Millisecond)
	h.heartbeat(id)
	h.clk.Advance(time.Second) // exactly a TTL since the heartbeat
	h.svc.expireDue()
	if !h.live(id) {
		t.Fatal("expired at exactly the TTL")
	}
	h.clk.Advance(time.Millisecond)
	h.svc.expireDue()
	if h.live(id) {
		t.Fatal("not expired past the TTL")
	}
}

// Invariant 3: a new leader gives every session a full TTL from the moment
// it is ready, however long ago the last heartbeat was.
func TestNewLeaderGivesFreshTTL(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Second)
	h.svc.LeaderLost()
	h.clk.Advance(10 * time.Second)
	h.svc.expireDue() // not leader: nothing
	h.becomeLeader()
	h.svc.expireDue()
	if !h.live(id) {
		t.Fatal("expired by a new leader before a full TTL")
	}
	h.clk.Advance(time.Second + time.Millisecond)
	h.svc.expireDue()
	if h.live(id) {
		t.Fatal("not expired a TTL after the new leader was ready")
	}
}

// A heartbeat that arrives while the session's expiry is in the log (not
// yet applied) is answered "gone", never "alive".
func TestHeartbeatDuringExpiryIsGone(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Second)
	h.clk.Advance(2 * time.Second)
	h.raf.hold = true
	h.svc.expireDue()
	alive, gone, _ := h.heartbeat(id)
	if alive || !gone {
		t.Fatalf("heartbeat during expiry: alive=%v gone=%v", alive, gone)
	}
	h.raf.commitPending()
	if h.live(id) {
		t.Fatal("expiry did not apply")
	}
}

// An Expire decided in one term and logged in another is ignored on apply.
func TestStaleTermExpireIgnored(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Second)
	data := fsm.Encode(&fsm.Command{Op: fsm.OpExpire, IDs: []uint64{id}, Term: h.raf.term - 1})
	if err := h.raf.Propose(context.Background(), data); err != nil {
		t.Fatal(err)
	}
	if !h.live(id) {
		t.Fatal("an expiry from an older term ended the session")
	}
}

// Losing leadership answers waiting requests NOT_LEADER so that clients
// re-send them to the next leader.
func TestLeaderLostAnswersWaiters(t *testing.T) {
	h := newHarness(t)
	a, b := h.open(time.Minute), h.open(time.Minute)
	if r := h.propose(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a, Seq: 1, Name: "x"}); r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatal(r)
	}
	got := h.proposeAsync(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: b, Seq: 1, Name: "x"})
	// Wait until b is queued.
	for {
		h.svc.mu.Lock()
		n := len(h.svc.m.Holder("x").Waiters)
		h.svc.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	h.raf.setLeader(2)
	h.svc.LeaderLost()
	if r := <-got; r.GetCode() != lockpb.Code_CODE_NOT_LEADER {
		t.Fatalf("waiter answered %v, want NOT_LEADER", r)
	}
	if r := h.propose(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: b, Seq: 1, Name: "x"}); r.GetCode() != lockpb.Code_CODE_NOT_LEADER || r.GetLeaderHint() != 2 {
		t.Fatalf("request to a replica that is not leader: %v", r)
	}
}

// A leader that has not applied an entry of its term yet holds a request
// until it is ready (answered OK, not UNAVAILABLE), or until it is deposed
// (NOT_LEADER with the new leader's hint), or until ReadyWait runs out
// (UNAVAILABLE).
func TestRequestWaitsForLeaderReady(t *testing.T) {
	h := newHarness(t)
	a := h.open(time.Minute)
	h.svc.LeaderLost() // still raft's leader (Status), not ready: a new term starts
	got := make(chan *lockpb.Response, 1)
	send := func(seq uint64) {
		go func() {
			resp, err := h.svc.Propose(context.Background(), &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a, Seq: seq, Name: fmt.Sprint("x", seq)})
			if err != nil {
				t.Error(err)
			}
			got <- resp
		}()
	}
	send(1)
	select {
	case r := <-got:
		t.Fatalf("answered %v before the leader was ready", r)
	case <-time.After(50 * time.Millisecond):
	}
	h.becomeLeader()
	if r := <-got; r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("held request answered %v once the leader was ready; want OK", r)
	}

	h.svc.LeaderLost()
	send(2)
	time.Sleep(20 * time.Millisecond)
	h.raf.setLeader(2)
	h.svc.LeaderLost() // deposed
	if r := <-got; r.GetCode() != lockpb.Code_CODE_NOT_LEADER || r.GetLeaderHint() != 2 {
		t.Fatalf("held request answered %v after the leader was deposed; want NOT_LEADER, hint 2", r)
	}

	h.raf.setLeader(1)
	h.svc.cfg.ReadyWait = 30 * time.Millisecond
	send(3)
	if r := <-got; r.GetCode() != lockpb.Code_CODE_UNAVAILABLE {
		t.Fatalf("request at a leader that never became ready: %v; want UNAVAILABLE after ReadyWait", r)
	}
}

// A request held at a not-ready leader is answered NOT_LEADER with the new
// leader's hint as soon as the Status names it, also when, as in raftnode,
// LeaderLost comes first and the Status after it. (Found by review: it
// used to sleep until ReadyWait and answer with the stale code and hint.)
func TestAwaitReadyDeposedBeforeStatus(t *testing.T) {
	h := newHarness(t)
	a := h.open(time.Minute)
	h.svc.cfg.ReadyWait = time.Minute
	h.svc.LeaderLost() // new term, raft leader (Status) but not ready
	got := make(chan *lockpb.Response, 1)
	go func() {
		resp, _ := h.svc.Propose(context.Background(), &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a, Seq: 1, Name: "x"})
		got <- resp
	}()
	time.Sleep(30 * time.Millisecond) // the request is held

	h.svc.LeaderLost()
	time.Sleep(5 * time.Millisecond)
	h.raf.setLeader(2)
	select {
	case r := <-got:
		if r.GetCode() != lockpb.Code_CODE_NOT_LEADER || r.GetLeaderHint() != 2 {
			t.Fatalf("answered %v; want NOT_LEADER hint 2", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request held at a deposed leader was not answered within 5 s")
	}
}

// A request held at a leader that is not ready yet is answered NOT_LEADER
// (hint 0, never itself) as soon as its raft node stops, and a request
// that arrives after the stop is answered so at once: the stopped node's
// last Status still names it the leader, and it will never be ready.
// (Found by a crash test: a leader stopped by a failed fsync held its
// callers until their own deadlines.)
func TestAwaitReadyEndsWhenNodeStops(t *testing.T) {
	h := newHarness(t)
	a := h.open(time.Minute)
	h.svc.cfg.ReadyWait = time.Minute
	h.raf.mu.Lock()
	h.raf.done = make(chan struct{})
	h.raf.mu.Unlock()
	h.svc.LeaderLost() // raft's leader (Status), not ready
	got := make(chan *lockpb.Response, 1)
	go func() {
		resp, _ := h.svc.Propose(context.Background(), &lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: a, Seq: 1, Name: "x"})
		got <- resp
	}()
	select {
	case r := <-got:
		t.Fatalf("answered %v before the node stopped", r)
	case <-time.After(30 * time.Millisecond):
	}
	close(h.raf.done)
	select {
	case r := <-got:
		if r.GetCode() != lockpb.Code_CODE_NOT_LEADER || r.GetLeaderHint() != 0 {
			t.Fatalf("held request after the node stopped: %v; want NOT_LEADER, hint 0", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a request held at a stopped node was not answered within 5 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	r, err := h.svc.Propose(ctx, &lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: a, Seq: 2, Name: "x"})
	if err != nil || r.GetCode() != lockpb.Code_CODE_NOT_LEADER || r.GetLeaderHint() != 0 {
		t.Fatalf("request after the node stopped: %v, %v after %v; want NOT_LEADER, hint 0", r, err, time.Since(start))
	}
}

// An acquire that would wait behind another session's hold is proposed
// with ProposeDeferred; an acquire of a free lock, a try and a no-wait
// acquire are not. While it is held, an apply that leaves its lock with
// another session does not ask raft for it; the apply that frees the lock
// does (ReleaseDeferred), and the acquire, once proposed, is granted.
func TestWaitingAcquireIsDeferred(t *testing.T) {
	h := newHarness(t)
	a, b, c := h.open(time.Minute), h.open(time.Minute), h.open(time.Minute)
	counts := func() (deferred, releases int) {
		h.raf.mu.Lock()
		defer h.raf.mu.Unlock()
		return h.raf.deferredCalls, h.raf.releases
	}
	want := func(what string, r *lockpb.Response, code lockpb.Code, deferred, releases int) {
		t.Helper()
		if r != nil && r.GetCode() != code {
			t.Fatalf("%s: %v, want %v", what, r, code)
		}
		if d, rel := counts(); d != deferred || rel != releases {
			t.Fatalf("after %s: %d deferred proposals, %d releases; want %d, %d", what, d, rel, deferred, releases)
		}
	}
	x := h.propose(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a, Seq: 1, Name: "x"})
	want("acquire of a free lock", x, lockpb.Code_CODE_OK, 0, 0)
	want("acquire of a held lock by its holder",
		h.propose(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a, Seq: 2, Name: "x"}), lockpb.Code_CODE_OK, 0, 0)
	want("try-acquire of a held lock",
		h.propose(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: c, Seq: 1, Name: "x", Try: true}), lockpb.Code_CODE_LOCKED, 0, 0)
	y := h.propose(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a, Seq: 3, Name: "y"})
	q := h.propose(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: c, Seq: 2, Name: "y", NoWait: true})
	want("no-wait acquire of a held lock", q, lockpb.Code_CODE_OK, 0, 0)
	if !q.GetQueued() {
		t.Fatalf("no-wait acquire of a held lock: %v, want queued", q)
	}

	h.raf.mu.Lock()
	h.raf.holdDeferred = true
	h.raf.mu.Unlock()
	got := h.proposeAsync(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: b, Seq: 1, Name: "x"})
	for d, _ := counts(); d == 0; d, _ = counts() {
		time.Sleep(time.Millisecond)
	}
	want("a waiting acquire", nil, 0, 1, 0)
	// y passes from a to c: x is still a's.
	want("a release that leaves the held acquire's lock held",
		h.propose(&lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: a, Seq: 4, Name: "y", Token: y.GetToken()}), lockpb.Code_CODE_OK, 1, 0)
	want("the release of the held acquire's lock",
		h.propose(&lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: a, Seq: 5, Name: "x", Token: x.GetToken()}), lockpb.Code_CODE_OK, 1, 1)
	// Released once: a later apply does not ask again (the acquire is out
	// of raft's hands, or will not be held).
	want("an apply after the release",
		h.propose(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: c, Seq: 3, Name: "w"}), lockpb.Code_CODE_OK, 1, 1)
	select {
	case r := <-got:
		t.Fatalf("the held acquire was answered before it was proposed: %v", r)
	default:
	}
	h.raf.proposeHeld()
	if r := <-got; r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("the deferred acquire, proposed after the release: %v, want OK", r)
	}
	h.svc.mu.Lock()
	defer h.svc.mu.Unlock()
	if len(h.svc.deferred) != 0 {
		t.Fatalf("deferred acquires still tracked after they applied: %v", h.svc.deferred)
	}
}

// A watcher sees every change of its lock in log order, also when a grant
// and its release are applied in one batch (a lagging replica applies
// whatever has committed at once).
func TestWatchSeesEveryChangeInABatch(t *testing.T) {
	h := newHarness(t)
	a := h.open(time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ch := h.svc.Watch(ctx, "x")
	next := func() fsm.LockInfo { t.Helper(); return nextChange(ctx, t, "x", ch) }
	if li := next(); li.Holder != 0 {
		t.Fatalf("initial state %+v, want free", li)
	}
	i, term := h.reserve(2)
	entry := func(index uint64, cmd fsm.Command) *raftpb.Entry { return entryAt(index, term, cmd) }
	h.svc.Apply([]*raftpb.Entry{
		entry(i, fsm.Command{Op: fsm.OpAcquire, Session: a, Seq: 1, Name: "x"}),
		entry(i+1, fsm.Command{Op: fsm.OpRelease, Session: a, Seq: 2, Name: "x", Token: i}),
	})
	if li := next(); li.Holder != a || li.Token != i {
		t.Fatalf("first change %+v, want held by %d with token %d", li, a, i)
	}
	if li := next(); li.Holder != 0 {
		t.Fatalf("second change %+v, want free", li)
	}
}

// A request's list of its session's other requests in flight must be
// short, increasing and below its seq: the fsm retires every other seq
// below on the strength of it. A bad list is refused before it is logged;
// a good one reaches the command.
func TestPendingListChecked(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Minute)
	long := make([]uint64, MaxListed+1)
	for i := range long {
		long[i] = uint64(i + 1)
	}
	for _, bad := range [][]uint64{{5, 3}, {3, 3}, {100}, {101}, long} {
		r := h.propose(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: id, Seq: 100, Done: 1, Name: "a", Listed: true, Pending: bad})
		if r.GetCode() != lockpb.Code_CODE_INVALID {
			t.Fatalf("pending %v with seq 100: %v, want INVALID", bad, r)
		}
	}
	h.raf.mu.Lock()
	before := h.raf.index
	h.raf.mu.Unlock()
	r := h.propose(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: id, Seq: 10, Done: 3, Name: "a", Listed: true, Pending: []uint64{3, 7}})
	if r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("a good list: %v", r)
	}
	h.raf.mu.Lock()
	defer h.raf.mu.Unlock()
	if h.raf.index != before+1 {
		t.Fatalf("%d entries proposed, want 1", h.raf.index-before)
	}
	var cmd fsm.Command
	if err := fsm.Decode(h.raf.last, &cmd); err != nil {
		t.Fatal(err)
	}
	if !cmd.Listed || len(cmd.Pending) != 2 || cmd.Pending[0] != 3 || cmd.Pending[1] != 7 {
		t.Fatalf("the command lists %v (listed %v), want [3 7]", cmd.Pending, cmd.Listed)
	}
}

// Watchers see the changes of commands that name no lock: a session's
// close frees (or hands off) every lock it held, an expiry the same, and
// each watched lock reports it; a command naming one lock reports to that
// lock's watchers. (Only single-lock commands skip the other watched
// locks.)
func TestWatchSeesSessionEndsOnEveryLock(t *testing.T) {
	h := newHarness(t)
	a, b := h.open(time.Minute), h.open(time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	chs := map[string]<-chan fsm.LockInfo{"x": h.svc.Watch(ctx, "x"), "y": h.svc.Watch(ctx, "y"), "z": h.svc.Watch(ctx, "z")}
	next := func(name string) fsm.LockInfo { t.Helper(); return nextChange(ctx, t, name, chs[name]) }
	for name := range chs {
		if li := next(name); li.Holder != 0 {
			t.Fatalf("initial state of %s %+v, want free", name, li)
		}
	}
	i, term := h.reserve(6)
	entry := func(index uint64, cmd fsm.Command) *raftpb.Entry { return entryAt(index, term, cmd) }
	h.svc.Apply([]*raftpb.Entry{
		entry(i, fsm.Command{Op: fsm.OpAcquire, Session: a, Seq: 1, Name: "x"}),
		entry(i+1, fsm.Command{Op: fsm.OpAcquire, Session: a, Seq: 2, Name: "y"}),
		entry(i+2, fsm.Command{Op: fsm.OpAcquire, Session: b, Seq: 1, Name: "x"}), // queued behind a
		entry(i+3, fsm.Command{Op: fsm.OpAcquire, Session: b, Seq: 2, Name: "z"}),
	})
	if li := next("x"); li.Holder != a || li.Token != i {
		t.Fatalf("x %+v, want held by %d with token %d", li, a, i)
	}
	if li := next("y"); li.Holder != a || li.Token != i+1 {
		t.Fatalf("y %+v, want held by %d with token %d", li, a, i+1)
	}
	if li := next("z"); li.Holder != b || li.Token != i+3 {
		t.Fatalf("z %+v, want held by %d with token %d", li, b, i+3)
	}
	h.svc.Apply([]*raftpb.Entry{entry(i+4, fsm.Command{Op: fsm.OpCloseSession, Session: a, Seq: 3})})
	if li := next("x"); li.Holder != b || li.Token != i+4 {
		t.Fatalf("x after a's close %+v, want handed to %d with token %d", li, b, i+4)
	}
	if li := next("y"); li.Holder != 0 {
		t.Fatalf("y after a's close %+v, want free", li)
	}
	h.svc.Apply([]*raftpb.Entry{entry(i+5, fsm.Command{Op: fsm.OpExpire, IDs: []uint64{b}, Term: term})})
	for _, name := range []string{"x", "z"} {
		if li := next(name); li.Holder != 0 {
			t.Fatalf("%s after b's expiry %+v, want free", name, li)
		}
	}
}

// reserve takes the next n log indexes of the fake raft for entries the
// test applies itself, and returns the first with the current term.
func (h *harness) reserve(n uint64) (first, term uint64) {
	h.raf.mu.Lock()
	defer h.raf.mu.Unlock()
	first = h.raf.index + 1
	h.raf.index += n
	return first, h.raf.term
}

// entryAt is the log entry of cmd at index in term.
func entryAt(index, term uint64, cmd fsm.Command) *raftpb.Entry {
	return &raftpb.Entry{Index: new(index), Term: new(term), Type: raftpb.EntryNormal.Enum(), Data: fsm.Encode(&cmd)}
}

// nextChange returns the next state a watch of name reports, failing the
// test if the watch closes or ctx ends first.
func nextChange(ctx context.Context, t *testing.T, name string, ch <-chan fsm.LockInfo) fsm.LockInfo {
	t.Helper()
	select {
	case li, ok := <-ch:
		if !ok {
			t.Fatalf("watch of %s closed", name)
		}
		return li
	case <-ctx.Done():
		t.Fatalf("no change of %s reported", name)
	}
	return fsm.LockInfo{}
}
