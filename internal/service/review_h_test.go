package service

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// lagRaft is a fakeRaft whose replica lags the leader: ReadIndex answers
// the index of every entry proposed, held ones included (the leader's
// commit index), and WaitApplied applies the held entries, as a follower
// catching up does. It records the indexes waited for.
type lagRaft struct {
	*fakeRaft
	mu     sync.Mutex
	waited []uint64
}

func (r *lagRaft) WaitApplied(ctx context.Context, index uint64) error {
	r.mu.Lock()
	r.waited = append(r.waited, index)
	r.mu.Unlock()
	r.commitPending()
	return nil
}

// lagBehind binds a lagRaft to h's service and proposes cmd as an entry
// the leader committed that this replica has not applied yet; it returns
// the lagRaft and the entry's index.
func lagBehind(t *testing.T, h *harness, cmd *fsm.Command) (*lagRaft, uint64) {
	t.Helper()
	lag := &lagRaft{fakeRaft: h.raf}
	h.svc.Bind(lag)
	h.raf.mu.Lock()
	h.raf.hold = true
	h.raf.mu.Unlock()
	if err := h.raf.Propose(context.Background(), fsm.Encode(cmd)); err != nil {
		t.Fatal(err)
	}
	h.raf.mu.Lock()
	defer h.raf.mu.Unlock()
	return lag, h.raf.index
}

// checkWaitedOnce fails t unless WaitApplied was called once, for an index
// of at least want.
func (r *lagRaft) checkWaitedOnce(t *testing.T, want uint64) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.waited) != 1 || r.waited[0] < want {
		t.Fatalf("WaitApplied calls %v, want one for an index >= %d", r.waited, want)
	}
}

// TestReviewHHolderWaitsForReadIndexApplied: a Holder read waits until this
// replica has applied the confirmed read index before it reads the table
// (DESIGN.md invariant 9). Mutation it catches (review H): linearize
// confirming leadership with ReadIndex but answering from the table as it
// is, without WaitApplied: a replica behind the leader's commit index
// answers from stale state.
func TestReviewHHolderWaitsForReadIndexApplied(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Minute)
	// An acquire the leader committed that this replica has not applied.
	lag, want := lagBehind(t, h, &fsm.Command{Op: fsm.OpAcquire, Session: id, Seq: 1, Name: "x"})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := h.svc.Holder(ctx, &lockpb.HolderRequest{Name: "x"})
	if err != nil {
		t.Fatalf("Holder: %v", err)
	}
	if resp.GetSession() != id || resp.GetToken() != want {
		t.Fatalf("Holder(x) = session %d token %d, want session %d token %d (the committed grant)", resp.GetSession(), resp.GetToken(), id, want)
	}
	lag.checkWaitedOnce(t, want)
}

// TestReviewHWaiterOfEndedSessionIsNotGranted: an Acquire waiting in a
// queue whose session ends (here by expiry) is answered NO_SESSION, never
// as a grant, and the lock goes to the next live waiter (DESIGN.md
// invariant 8). Mutation it catches (review H): Service.Apply answering
// the grant waiters of an ended session CODE_OK.
func TestReviewHWaiterOfEndedSessionIsNotGranted(t *testing.T) {
	h := newHarness(t)
	a := h.open(time.Minute)
	b := h.open(time.Second)
	c := h.open(time.Minute)
	held := h.propose(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a, Seq: 1, Name: "x"})
	if held.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("holder's acquire: %v", held)
	}
	gotB := h.proposeAsync(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: b, Seq: 1, Name: "x"})
	gotC := h.proposeAsync(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: c, Seq: 1, Name: "x"})
	deadline := time.Now().Add(5 * time.Second)
	queued := func() int {
		h.svc.mu.Lock()
		defer h.svc.mu.Unlock()
		return len(h.svc.m.Holder("x").Waiters)
	}
	for queued() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the acquires never queued")
		}
		time.Sleep(time.Millisecond)
	}
	// b's TTL passes without a heartbeat; a's and c's do not.
	h.clk.Advance(1100 * time.Millisecond)
	h.svc.expireDue()
	if h.live(b) {
		t.Fatal("session b not expired")
	}
	select {
	case r := <-gotB:
		if r.GetCode() != lockpb.Code_CODE_NO_SESSION {
			t.Fatalf("waiter of the expired session answered %v (token %d), want CODE_NO_SESSION", r.GetCode(), r.GetToken())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter of the expired session never answered")
	}
	if r := h.propose(&lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: a, Seq: 2, Name: "x", Token: held.GetToken()}); r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("holder's release: %v", r)
	}
	select {
	case r := <-gotC:
		if r.GetCode() != lockpb.Code_CODE_OK || r.GetToken() <= held.GetToken() {
			t.Fatalf("live waiter after the release: %v, want OK with a token above %d", r, held.GetToken())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("live waiter never granted")
	}
}

// TestHeartbeatWaitsForReadIndexApplied: a heartbeat's answer comes after
// the leader has applied everything up to the read index it confirmed,
// so an entry committed before the answer that ends the session (here the
// client's own close, sent through another replica) makes it "gone", not
// "alive" (DESIGN.md invariant 4). Mutation it catches: Heartbeat
// confirming leadership with ReadIndex alone, without WaitApplied.
func TestHeartbeatWaitsForReadIndexApplied(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Minute)
	lag, want := lagBehind(t, h, &fsm.Command{Op: fsm.OpCloseSession, Session: id, Seq: 1, Done: 1, Listed: true})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	alive, gone, code, _ := h.svc.Heartbeat(ctx, []uint64{id})
	if code != lockpb.Code_CODE_OK {
		t.Fatalf("Heartbeat code %v, want OK", code)
	}
	if len(alive) != 0 || len(gone) != 1 || gone[0] != id {
		t.Fatalf("Heartbeat after a committed close: alive %v gone %v, want gone [%d]", alive, gone, id)
	}
	if h.live(id) {
		t.Fatalf("session %d still in the table after its close was applied", id)
	}
	lag.checkWaitedOnce(t, want)
}
