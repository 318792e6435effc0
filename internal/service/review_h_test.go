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

// TestReviewHHolderWaitsForReadIndexApplied: a Holder read waits until this
// replica has applied the confirmed read index before it reads the table
// (DESIGN.md invariant 9). Mutation it catches (review H): linearize
// confirming leadership with ReadIndex but answering from the table as it
// is, without WaitApplied: a replica behind the leader's commit index
// answers from stale state.
func TestReviewHHolderWaitsForReadIndexApplied(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Minute)
	lag := &lagRaft{fakeRaft: h.raf}
	h.svc.Bind(lag)

	// An acquire the leader committed that this replica has not applied.
	h.raf.mu.Lock()
	h.raf.hold = true
	h.raf.mu.Unlock()
	if err := h.raf.Propose(context.Background(), fsm.Encode(&fsm.Command{Op: fsm.OpAcquire, Session: id, Seq: 1, Name: "x"})); err != nil {
		t.Fatal(err)
	}
	h.raf.mu.Lock()
	want := h.raf.index
	h.raf.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := h.svc.Holder(ctx, &lockpb.HolderRequest{Name: "x"})
	if err != nil {
		t.Fatalf("Holder: %v", err)
	}
	if resp.GetSession() != id || resp.GetToken() != want {
		t.Fatalf("Holder(x) = session %d token %d, want session %d token %d (the committed grant)", resp.GetSession(), resp.GetToken(), id, want)
	}
	lag.mu.Lock()
	defer lag.mu.Unlock()
	if len(lag.waited) != 1 || lag.waited[0] < want {
		t.Fatalf("WaitApplied calls %v, want one for an index >= %d", lag.waited, want)
	}
}
