package service

import (
	"context"
	"errors"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/quorumlock/quorumlock/internal/fsm"
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

// kaStream is the server side of a KeepAlive stream whose client sends
// empty batches as fast as the server reads them and never reads the
// answers.
type kaStream struct {
	grpc.ServerStream
	ctx  context.Context
	recv func(n int) (*lockpb.KeepAliveRequest, error) // n counts Recv calls from 1
	n    int
}

func (k *kaStream) Context() context.Context { return k.ctx }

func (k *kaStream) Recv() (*lockpb.KeepAliveRequest, error) {
	k.n++
	return k.recv(k.n)
}

func (k *kaStream) Send(*lockpb.KeepAliveResponse) error {
	<-k.ctx.Done() // the client reads nothing
	return k.ctx.Err()
}

// A KeepAlive stream answers at most maxHeartbeatsInFlight batches at a
// time and reads the next batch only when one is answered: a client that
// sends faster than the leader confirms, or never reads its answers, is
// held back by flow control instead of making the leader start a
// goroutine (and a ReadIndex) for every batch it sends, without bound.
func TestKeepAliveBoundsBatchesInFlight(t *testing.T) {
	h := newHarness(t)
	gate := make(chan struct{})
	h.raf.mu.Lock()
	h.raf.readGate = gate // no batch is answered until gate opens
	h.raf.mu.Unlock()
	answered := 0
	var amu sync.Mutex
	h.svc.cfg.Hooks.Heartbeats = func(alive, gone int) { amu.Lock(); answered++; amu.Unlock() }
	reads := func() int { h.raf.mu.Lock(); defer h.raf.mu.Unlock(); return h.raf.reads }

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var early int // batches read beyond the bound while none was answered
	st := &kaStream{ctx: ctx, recv: func(n int) (*lockpb.KeepAliveRequest, error) {
		if n > maxHeartbeatsInFlight {
			amu.Lock()
			if answered == 0 {
				early++
			}
			amu.Unlock()
			return nil, io.EOF
		}
		return &lockpb.KeepAliveRequest{Batch: uint64(n)}, nil
	}}
	done := make(chan error, 1)
	go func() { done <- h.svc.KeepAlive(st) }()
	for reads() < maxHeartbeatsInFlight {
		runtime.Gosched()
	}
	close(gate)
	<-done
	if early > 0 {
		t.Fatalf("%d batches read beyond %d in flight before any was answered", early, maxHeartbeatsInFlight)
	}
}

// Invariants 3-5: an Expire whose proposal returned ctx's error may still
// be in the log (raft took it from the node's queue after the proposer
// gave up waiting), so its sessions stay marked expiring: a heartbeat that
// arrives before the entry commits is answered "gone", never "alive" (an
// "alive" would extend the client's lease past an expiry that then
// commits, and the session's locks go to others while the client still
// believes it holds them).
func TestHeartbeatAfterExpireProposalTimedOutIsNotAlive(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Second)
	h.clk.Advance(2 * time.Second)
	h.raf.mu.Lock()
	h.raf.late = true
	h.raf.mu.Unlock()
	h.svc.expireDue()
	alive, _, code := h.heartbeat(id)
	h.raf.commitPending()
	if h.live(id) {
		t.Fatal("the expiry in the log did not apply")
	}
	if alive {
		t.Fatalf("heartbeat acknowledged alive (%v) while the session's expiry was in the log; the expiry then committed", code)
	}
}

// An Expire that raft refuses (a leadership transfer under way, the leader
// keeps leading) is not in the log: its sessions are unmarked and the next
// scan proposes them again.
func TestRefusedExpireIsProposedAgain(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Second)
	h.clk.Advance(2 * time.Second)
	h.raf.mu.Lock()
	h.raf.refuse = true
	h.raf.mu.Unlock()
	h.svc.expireDue()
	// The refusal arrives on raft's goroutine; wait until it is handled.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		h.svc.mu.Lock()
		marked := h.svc.expiring[id]
		h.svc.mu.Unlock()
		if !marked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the refused expiry left its session marked expiring")
		}
	}
	if !h.live(id) {
		t.Fatal("a refused expiry ended the session")
	}
	h.raf.mu.Lock()
	h.raf.refuse = false
	h.raf.mu.Unlock()
	h.svc.expireDue()
	if h.live(id) {
		t.Fatal("the session was not expired again after its expiry was refused")
	}
}

// Invariants 3-5: applying an Expire that is ignored (decided in an older
// term than the one it was logged in) leaves the expiry marks alone: they
// belong to this leadership's own Expire, still in the log behind it, and a
// heartbeat arriving between the two applies must be answered "gone", not
// acknowledged alive just before its session expires.
func TestStaleExpireKeepsCurrentExpiryMarks(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Second)
	h.raf.hold = true
	// An Expire decided in the previous term that reached the log in this
	// one (its proposer lost and won leadership meanwhile).
	stale := fsm.Encode(&fsm.Command{Op: fsm.OpExpire, IDs: []uint64{id}, Term: h.raf.term - 1})
	if err := h.raf.Propose(t.Context(), stale); err != nil {
		t.Fatal(err)
	}
	h.clk.Advance(2 * time.Second)
	h.svc.expireDue() // this term's Expire, behind the stale one
	h.raf.mu.Lock()
	first := h.raf.pending[:1]
	h.raf.pending = h.raf.pending[1:]
	h.raf.mu.Unlock()
	h.svc.Apply(first)
	if !h.live(id) {
		t.Fatal("the stale Expire ended the session")
	}
	alive, _, code := h.heartbeat(id)
	h.raf.commitPending()
	if h.live(id) {
		t.Fatal("this term's Expire did not apply")
	}
	if alive {
		t.Fatalf("heartbeat acknowledged alive (%v) between a stale Expire and this term's Expire of the session", code)
	}
}
