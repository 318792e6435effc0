package quorumlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/service"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// TestReviewQStaleCopiesDoNotFailAcquire: the leader bounds the copies of
// one request in flight (service.MaxCopiesInFlight). Copies a client gave
// up on can still wait there: one sent on a connection that died without
// the leader noticing (no reset reached it) waits until its request is
// answered. Here MaxCopiesInFlight such copies of a session's first
// acquire (seq 1) wait for a held lock, on a raw stream that never
// cancels them. The session's own Acquire of that request must not fail
// with ErrLimit ("nothing changed"): the copies keep the session queued,
// and the lock is granted to it once the holder releases, a grant
// nobody would know of. It must keep waiting and get the lock.
func TestReviewQStaleCopiesDoNotFailAcquire(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	n := c.Node(c.WaitLeader(10 * time.Second))
	ctx := testCtx(t, 30*time.Second)
	holder := newSession(t, n)
	held, err := holder.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(t, n)
	commit0 := n.Status().Commit
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := dialLeader(t, n).ProposeStream(sctx)
	if err != nil {
		t.Fatal(err)
	}
	calls := make([]*lockpb.ProposeCall, service.MaxCopiesInFlight)
	for i := range calls {
		calls[i] = &lockpb.ProposeCall{Id: uint64(i + 1), Request: &lockpb.Request{
			Op: lockpb.Op_OP_ACQUIRE, Session: s.ID(), Seq: 1, Done: 1, Listed: true, Name: "x"}}
	}
	if err := st.Send(&lockpb.ProposeCalls{Calls: calls}); err != nil {
		t.Fatal(err)
	}
	// Every copy proposes an entry once it is registered.
	for deadline := time.Now().Add(10 * time.Second); n.Status().Commit < commit0+uint64(len(calls)); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d copies committed", n.Status().Commit-commit0, len(calls))
		}
	}
	type result struct {
		l   *quorumlock.Lock
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := s.Acquire(ctx, "x")
		got <- result{l, err}
	}()
	select {
	case r := <-got:
		t.Fatalf("Acquire returned while the lock is held: %v, %v", r.l, r.err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			info, _ := n.Holder(ctx, "x")
			t.Fatalf("Acquire: %v; the cluster lists holder %d (the session is %d)", r.err, info.Holder, s.ID())
		}
		if info, err := n.Holder(ctx, "x"); err != nil || info.Holder != s.ID() {
			t.Fatalf("Acquire returned a lock; the cluster lists %v, %v", info, err)
		}
	case <-ctx.Done():
		t.Fatal("Acquire not answered after the release")
	}
}
