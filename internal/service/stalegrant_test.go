package service

import (
	"context"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/raftnode"
)

// gatedRaft delays one proposal between the service's registration of its
// waiters and raft's taking of the entry (the proposing goroutine was
// descheduled after s.mu.Unlock, or the node's queue was busy).
type gatedRaft struct {
	*fakeRaft
	match   func(*fsm.Command) bool
	reached chan struct{}
	gate    chan struct{}
}

func (g *gatedRaft) ProposeAsync(ctx context.Context, p raftnode.AsyncProposal) error {
	var cmd fsm.Command
	if fsm.Decode(p.Data, &cmd) == nil && g.match(&cmd) {
		close(g.reached)
		<-g.gate
	}
	return g.fakeRaft.ProposeAsync(ctx, p)
}

// A blocking acquire B of session S registers its grant waiter for x while
// S already waits for x (acquire A). The grant to S arrives before B's
// entry reaches raft; S releases that grant and x passes to W. B's entry
// then applies: S joins x's queue again (CodeQueued). B must wait for a
// grant after its own apply: before grant waiters were armed by their
// request's apply, B took the grant delivered before it, answered "OK,
// token T" for a grant already released, and S was later granted x with
// no Lock (found by a review).
func TestGrantBeforeTheAcquireAppliedIsNotItsAnswer(t *testing.T) {
	h := newHarness(t)
	p, s, w := h.open(time.Minute), h.open(time.Minute), h.open(time.Minute)
	g := &gatedRaft{fakeRaft: h.raf, reached: make(chan struct{}), gate: make(chan struct{}),
		match: func(c *fsm.Command) bool { return c.Op == fsm.OpAcquire && c.Session == s && c.Seq == 2 }}
	h.svc.Bind(g)

	px := h.propose(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: p, Seq: 1, Done: 1, Name: "x"})
	if px.GetCode() != lockpb.Code_CODE_OK {
		t.Fatal(px)
	}
	gotA := h.proposeAsync(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: s, Seq: 1, Done: 1, Listed: true, Name: "x"})
	waitWaiters := func(n int) {
		for {
			h.svc.mu.Lock()
			got := len(h.svc.m.Holder("x").Waiters)
			h.svc.mu.Unlock()
			if got == n {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitWaiters(1)
	_ = h.proposeAsync(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: w, Seq: 1, Done: 1, Name: "x"})
	waitWaiters(2)
	gotB := h.proposeAsync(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: s, Seq: 2, Done: 1, Listed: true, Pending: []uint64{1}, Name: "x"})
	<-g.reached // B's waiters are registered; its entry has not reached raft

	rel := h.propose(&lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: p, Seq: 2, Done: 2, Name: "x", Token: px.GetToken()})
	if rel.GetCode() != lockpb.Code_CODE_OK {
		t.Fatal(rel)
	}
	a := <-gotA
	if a.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("A: %v", a)
	}
	// S releases its grant (listing B, still in flight): x goes to W.
	r := h.propose(&lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: s, Seq: 3, Done: 2, Listed: true, Pending: []uint64{2}, Name: "x", Token: a.GetToken()})
	if r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatal(r)
	}
	close(g.gate)
	// B waits: no grant to S since its apply.
	var b *lockpb.Response
	select {
	case b = <-gotB:
	case <-time.After(200 * time.Millisecond):
	}
	h.svc.mu.Lock()
	info := h.svc.m.Holder("x")
	h.svc.mu.Unlock()
	sQueued := len(info.Waiters) > 0 && info.Waiters[0] == s
	if !sQueued || info.Holder != w {
		t.Fatalf("x: %+v, want held by W %d with S %d queued", info, w, s)
	}
	if b != nil {
		t.Fatalf("B answered %v while S is queued behind %d: the answer must come from a grant after B's apply", b, info.Holder)
	}
	// W releases: S is granted, and that grant answers B.
	if r := h.propose(&lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: w, Seq: 2, Done: 2, Name: "x", Token: info.Token}); r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatal(r)
	}
	select {
	case b = <-gotB:
	case <-time.After(5 * time.Second):
		t.Fatal("B not answered after the grant to S")
	}
	h.svc.mu.Lock()
	info = h.svc.m.Holder("x")
	h.svc.mu.Unlock()
	if b.GetCode() != lockpb.Code_CODE_OK || info.Holder != s || b.GetToken() != info.Token {
		t.Fatalf("B answered %v; x: %+v, want S's new grant", b, info)
	}
}
