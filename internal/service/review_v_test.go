package service

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/internal/fsm"
)

// A watcher that reads nothing while many changes apply still gets the
// latest 1,024 of them, in order, ending with the current state
// (Node.Observe and the README promise that only changes more than 1,024
// behind may be lost, never the latest state).
func TestReviewVSlowWatcherKeepsLatestChanges(t *testing.T) {
	h := newHarness(t)
	a := h.open(time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch := h.svc.Watch(ctx, "x")
	if li := nextChange(ctx, t, "x", ch); li.Holder != 0 {
		t.Fatalf("initial state %+v, want free", li)
	}
	const cycles = 1500 // 3,000 changes: grant, free, grant, ...
	first, term := h.reserve(2 * cycles)
	ents := make([]*raftpb.Entry, 0, 2*cycles)
	for i := range uint64(cycles) {
		idx, seq := first+2*i, 2*i+1
		ents = append(ents,
			entryAt(idx, term, fsm.Command{Op: fsm.OpAcquire, Session: a, Seq: seq, Done: seq, Name: "x"}),
			entryAt(idx+1, term, fsm.Command{Op: fsm.OpRelease, Session: a, Seq: seq + 1, Done: seq + 1, Name: "x", Token: idx}))
	}
	h.svc.Apply(ents)
	const documented = 1024
	last := first + 2*(cycles-1) // the last grant's token
	var got []fsm.LockInfo
	for n := len(got); n < 2 || got[n-2].Token != last || got[n-1].Holder != 0; n = len(got) {
		got = append(got, nextChange(ctx, t, "x", ch))
	}
	if len(got) < documented {
		t.Fatalf("the watcher got %d of the latest changes, want at least %d", len(got), documented)
	}
	// The last 1,024 changes: grants with tokens first+2i, each followed
	// by the free state.
	tail := got[len(got)-documented:]
	for j, li := range tail {
		k := documented - 1 - j // changes before the last one
		wantToken := uint64(0)
		if k%2 == 1 {
			wantToken = last - uint64(k-1)
		}
		if li.Token != wantToken || (wantToken != 0) != (li.Holder == a) {
			t.Fatalf("change %d from the end: %+v, want token %d", k, li, wantToken)
		}
	}
}
