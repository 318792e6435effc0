package service

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/raftnode"
)

// keepLog is memLog whose SaveSnapshot of a snapshot taken by this
// replica keeps the log behind it, as storage.LogStore's contract says
// (raft.MemoryStorage.ApplySnapshot replaces the log).
type keepLog struct{ memLog }

func (s keepLog) SaveSnapshot(snap *raftpb.Snapshot) error {
	md := snap.GetMetadata()
	if term, err := s.Term(md.GetIndex()); err == nil && term == md.GetTerm() {
		_, err := s.CreateSnapshot(md.GetIndex(), md.GetConfState(), snap.GetData())
		return err
	}
	return s.ApplySnapshot(snap)
}

// reviewNService is a Service over a real single-member raftnode (memLog),
// leading, with its clock standing still.
func reviewNService(t *testing.T) (*Service, *clock.Manual) {
	t.Helper()
	clk := clock.NewManual(time.Unix(1000, 0))
	svc := New(Config{Clock: clk, Limits: fsm.Limits{MinTTL: int64(time.Second), MaxTTL: int64(time.Hour)}})
	n, err := raftnode.New(raftnode.Config{
		ID: 1, Peers: []uint64{1}, Storage: keepLog{memLog{raft.NewMemoryStorage()}}, Transport: nopTransport{},
		StateMachine: svc, Clock: clk, TickInterval: 100 * time.Millisecond, ElectionTicks: 10, HeartbeatTicks: 1,
		SnapshotEntries: 500,
	})
	if err != nil {
		t.Fatal(err)
	}
	svc.Bind(n)
	n.Start()
	t.Cleanup(n.Stop)
	deadline := time.Now().Add(10 * time.Second)
	for code, _ := svc.readyCode(); code != lockpb.Code_CODE_OK; code, _ = svc.readyCode() {
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
		clk.Advance(100 * time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	return svc, clk
}

// sizes reports every map the service keeps per request, session or lock,
// and the lock table's, by name, for the long-run checks.
func (s *Service) reviewNSizes() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	grants := 0
	for _, byName := range s.grants {
		grants += len(byName) + 1
	}
	return map[string]int{
		"requests": len(s.requests), "grants": grants, "grantOf": len(s.grantOf), "waitCopies": len(s.waitCopies),
		"armed": len(s.armed), "deferred": len(s.deferred), "watchers": len(s.watchers),
		"last": len(s.last), "expiring": len(s.expiring),
		"sessions": s.m.NumSessions(), "locks": s.m.NumLocks(),
	}
}

// TestReviewNServiceMapsReturnToEmpty: after thousands of sessions opened
// and closed, each lock name used once, blocking acquires queued then
// cancelled (and withdrawn, as a client does), tries refused, and
// watches started and ended, every map of the service and the lock table
// is empty again: nothing is kept per request, per name or per session
// that is gone.
func TestReviewNServiceMapsReturnToEmpty(t *testing.T) {
	svc, clk := reviewNService(t)
	call, open := proposeFuncs(t, svc)
	const rounds = 1500
	for i := range rounds {
		name := fmt.Sprintf("n/%d", i)
		a, b := open(), open()
		wctx, wcancel := context.WithCancel(context.Background())
		watch := svc.Watch(wctx, name)
		<-watch
		got := call(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a, Seq: 1, Done: 1, Listed: true, Name: name})
		if got.GetCode() != lockpb.Code_CODE_OK || got.GetQueued() {
			t.Fatalf("round %d: a's acquire: %v", i, got)
		}
		if r := call(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: b, Seq: 1, Done: 1, Listed: true, Name: name, Try: true}); r.GetCode() != lockpb.Code_CODE_LOCKED {
			t.Fatalf("round %d: b's try: %v", i, r)
		}
		// b's blocking acquire queues, then its caller gives up.
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := svc.Propose(ctx, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: b, Seq: 2, Done: 2, Listed: true, Name: name})
			errc <- err
		}()
		// raft holds the deferred acquire until the next tick.
		for deadline := time.Now().Add(5 * time.Second); ; {
			svc.mu.Lock()
			queued := len(svc.m.Holder(name).Waiters) == 1
			svc.mu.Unlock()
			if queued {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: b's acquire never queued", i)
			}
			clk.Advance(100 * time.Millisecond)
			time.Sleep(50 * time.Microsecond)
		}
		cancel()
		if err := <-errc; err == nil {
			t.Fatalf("round %d: cancelled acquire returned no error", i)
		}
		if r := call(&lockpb.Request{Op: lockpb.Op_OP_WITHDRAW, Session: b, Seq: 3, Done: 3, Listed: true, Name: name, Target: 2}); r.GetCode() != lockpb.Code_CODE_WITHDRAWN {
			t.Fatalf("round %d: withdraw: %v", i, r)
		}
		if r := call(&lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: a, Seq: 2, Done: 2, Listed: true, Name: name, Token: got.GetToken()}); r.GetCode() != lockpb.Code_CODE_OK {
			t.Fatalf("round %d: release: %v", i, r)
		}
		wcancel()
		for range watch {
		}
		for _, id := range []uint64{a, b} {
			if r := call(&lockpb.Request{Op: lockpb.Op_OP_CLOSE_SESSION, Session: id, Seq: 4, Done: 4, Listed: true}); r.GetCode() != lockpb.Code_CODE_OK {
				t.Fatalf("round %d: close %d: %v", i, id, r)
			}
		}
	}
	// A watcher's goroutine unregisters after its channel closes.
	deadline := time.Now().Add(5 * time.Second)
	for {
		sz := svc.reviewNSizes()
		bad := false
		for k, v := range sz {
			if v != 0 {
				bad = true
				if time.Now().After(deadline) {
					t.Errorf("after %d rounds, %s holds %d entries, want 0", rounds, k, v)
				}
			}
		}
		if !bad || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReviewNAbandonedOpenExpiresAtOnce: an open whose proposer stops
// waiting before the entry applies (a client's attempt timed out under
// load; it sends a new open) opens a session nobody can learn the ID of.
// The leader expires it at its next scan instead of keeping it, and its
// place under MaxSessions, for its TTL: before, a client opening
// thousands of sessions at once left almost as many such sessions, and
// NewSession got ErrLimit with far fewer than MaxSessions in use.
func TestReviewNAbandonedOpenExpiresAtOnce(t *testing.T) {
	h := newHarness(t)
	h.raf.mu.Lock()
	h.raf.hold = true
	h.raf.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := h.svc.Propose(ctx, &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: time.Hour.Milliseconds()}); err == nil {
		t.Fatal("an open whose entry never applied returned no error")
	}
	h.raf.mu.Lock()
	h.raf.hold = false
	h.raf.mu.Unlock()
	h.raf.commitPending()
	if n, _ := h.svc.Counts(); n != 1 {
		t.Fatalf("%d sessions after the abandoned open applied, want 1", n)
	}
	// A session opened meanwhile for a proposer that waits is kept.
	kept := h.open(time.Hour)
	h.clk.Advance(time.Millisecond)
	h.svc.expireDue()
	if n, _ := h.svc.Counts(); n != 1 || !h.live(kept) {
		t.Fatalf("after the next scan: %d sessions (the awaited one live: %v), want only the awaited one", n, h.live(kept))
	}
	if sz := h.svc.reviewNSizes(); sz["last"] != 1 || sz["expiring"] != 0 {
		t.Fatalf("sizes after the expiry: %v", sz)
	}
	h.svc.mu.Lock()
	left := len(h.svc.abandonedOpens)
	h.svc.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d abandoned opens still recorded", left)
	}
}

// TestReviewNCopiesOfOneRequestBounded: copies of one request (session,
// seq) waiting at once are bounded by MaxCopiesInFlight; one more is
// answered CODE_UNAVAILABLE (retry; not CODE_LIMIT, see review Q's
// TestReviewQStaleCopiesDoNotFailAcquire) at once and proposes nothing, and the waiting
// copies are all answered when the request applies. Before, every copy
// proposed an entry and waited (on a stream, in a goroutine of its own),
// without bound.
func TestReviewNCopiesOfOneRequestBounded(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Hour)
	h.raf.mu.Lock()
	h.raf.hold = true
	h.raf.mu.Unlock()
	req := &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: id, Seq: 1, Done: 1, Name: "x"}
	var got []<-chan *lockpb.Response
	for range MaxCopiesInFlight {
		got = append(got, h.proposeAsync(req))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.svc.mu.Lock()
		n := len(h.svc.requests[reqKey{id, 1}])
		h.svc.mu.Unlock()
		if n == MaxCopiesInFlight {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d copies waiting, want %d", n, MaxCopiesInFlight)
		}
		time.Sleep(time.Millisecond)
	}
	h.raf.mu.Lock()
	proposed := len(h.raf.pending)
	h.raf.mu.Unlock()
	if r := h.propose(req); r.GetCode() != lockpb.Code_CODE_UNAVAILABLE {
		t.Fatalf("copy %d: %v, want CODE_UNAVAILABLE", MaxCopiesInFlight+1, r)
	}
	h.raf.mu.Lock()
	if len(h.raf.pending) != proposed {
		t.Errorf("the refused copy proposed an entry")
	}
	h.raf.hold = false
	h.raf.mu.Unlock()
	h.raf.commitPending()
	for i, c := range got {
		select {
		case r := <-c:
			if r.GetCode() != lockpb.Code_CODE_OK {
				t.Fatalf("copy %d: %v", i, r)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("copy %d not answered", i)
		}
	}
}
