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
