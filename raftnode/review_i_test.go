package raftnode

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Stop documents "stops the node's goroutine and waits for it.
// Idempotent": on a Node that New made but nobody started (an embedder's
// error path between New and Start), it blocked forever. It now returns,
// Done closes, calls answer ErrStopped, and a later Start runs nothing; a
// second Start does not run a second loop.
func TestReviewIStopWithoutStart(t *testing.T) {
	n, err := New(Config{ID: 1, Peers: []uint64{1}, Storage: newMemStore(), Transport: nopTransport{}, StateMachine: &recSM{}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() {
		n.Stop()
		n.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop of a node never started did not return")
	}
	waitDone(t, "Done of a stopped node", n.Done())
	n.Start() // after Stop: must not run the loop
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.Propose(ctx, []byte("x")); !errors.Is(err, ErrStopped) {
		t.Errorf("Propose on a node stopped before Start: %v, want ErrStopped", err)
	}
	if _, err := n.ReadIndex(ctx); !errors.Is(err, ErrStopped) {
		t.Errorf("ReadIndex on a node stopped before Start: %v, want ErrStopped", err)
	}
	if err := n.WaitApplied(ctx, 1<<40); !errors.Is(err, ErrStopped) {
		t.Errorf("WaitApplied on a node stopped before Start: %v, want ErrStopped", err)
	}
}

// Start twice runs one loop: a second would drive the same RawNode from two
// goroutines. The node campaigns and leads alone as a single voter, and
// Stop returns.
func TestReviewIStartTwice(t *testing.T) {
	sm := &recSM{}
	n, err := New(Config{ID: 1, Peers: []uint64{1}, Storage: newMemStore(), Transport: nopTransport{}, StateMachine: sm,
		TickInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	n.Start()
	n.Start()
	defer n.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for n.Status().Leader != 1 {
		if ctx.Err() != nil {
			t.Fatal("a single voter did not become leader")
		}
		time.Sleep(time.Millisecond)
	}
	if err := n.LinearizableRead(ctx); err != nil {
		t.Fatal(err)
	}
}
