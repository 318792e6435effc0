package service

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/fsm"
)

// TestReviewADReadableWaitsForReadIndexApplied: Readable of a name over
// MaxNameBytes (a lock granted under a larger stamped limit, before a
// rolling change lowered it) answers from the table as of a linearizable
// read (DESIGN.md invariant 9): a replica that has not yet applied the
// committed grant waits for the read index and reports the name readable.
// Mutation it catches (review AD): Readable answering from the table as it
// is, without linearize; Watch and Observe of such a name then end at once
// on a lagging replica.
func TestReviewADReadableWaitsForReadIndexApplied(t *testing.T) {
	h := newHarness(t)
	id := h.open(time.Minute)
	lag := &lagRaft{fakeRaft: h.raf}
	h.svc.Bind(lag)

	long := strings.Repeat("n", 300) // over the default MaxNameBytes (256)
	h.raf.mu.Lock()
	h.raf.hold = true
	h.raf.mu.Unlock()
	cmd := &fsm.Command{Op: fsm.OpAcquire, Session: id, Seq: 1, Name: long, Limits: fsm.Stamped{MaxNameBytes: 1024}}
	if err := h.raf.Propose(context.Background(), fsm.Encode(cmd)); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ok, err := h.svc.Readable(ctx, long)
	if err != nil {
		t.Fatalf("Readable: %v", err)
	}
	if !ok {
		t.Fatal("Readable of a committed grant's long name = false on a replica that had not applied it yet: it read the table without waiting for the read index")
	}
	h.svc.mu.Lock()
	holder := h.svc.m.HolderID(long)
	h.svc.mu.Unlock()
	if holder != id {
		t.Fatalf("the grant was not applied: holder %d, want %d", holder, id)
	}
}
