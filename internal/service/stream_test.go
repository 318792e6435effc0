package service

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// streamHarness serves h's service over gRPC on loopback and opens one
// ProposeStream to it.
func streamHarness(t *testing.T, h *harness) lockpb.Lock_ProposeStreamClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	lockpb.RegisterLockServer(srv, h.svc)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	st, err := lockpb.NewLockClient(cc).ProposeStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// recvReplies reads replies until want ids have been answered and returns
// them by id; an id answered twice or not asked for fails the test.
func recvReplies(t *testing.T, st lockpb.Lock_ProposeStreamClient, want ...uint64) map[uint64]*lockpb.Response {
	t.Helper()
	asked := make(map[uint64]bool)
	for _, id := range want {
		asked[id] = true
	}
	got := make(map[uint64]*lockpb.Response)
	for len(got) < len(want) {
		in, err := st.Recv()
		if err != nil {
			t.Fatalf("Recv: %v (answered %d of %d)", err, len(got), len(want))
		}
		for _, r := range in.GetReplies() {
			if !asked[r.GetId()] || got[r.GetId()] != nil {
				t.Fatalf("unexpected reply %v", r)
			}
			got[r.GetId()] = r.GetResponse()
		}
	}
	return got
}

func call(id uint64, req *lockpb.Request) *lockpb.ProposeCall {
	return &lockpb.ProposeCall{Id: id, Request: req}
}

// TestProposeStream: calls on one stream are answered by id, a batch of
// calls in one message gets every answer, and a cancelled call stops
// waiting at the server (its grant waiter is gone) and is not answered,
// while the stream goes on serving.
func TestProposeStream(t *testing.T) {
	h := newHarness(t)
	a, b := h.open(time.Hour), h.open(time.Hour)
	st := streamHarness(t, h)
	send := func(calls ...*lockpb.ProposeCall) {
		t.Helper()
		if err := st.Send(&lockpb.ProposeCalls{Calls: calls}); err != nil {
			t.Fatal(err)
		}
	}

	send(call(1, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a, Seq: 1, Name: "x"}))
	held := recvReplies(t, st, 1)[1]
	if held.GetCode() != lockpb.Code_CODE_OK || held.GetToken() == 0 {
		t.Fatalf("acquire by a: %v", held)
	}

	// b queues behind a, then gives up.
	send(call(2, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: b, Seq: 1, Name: "x"}))
	waitFor(t, "b's grant waiter", func() bool { return h.grantWaiters(b) == 1 })
	send(&lockpb.ProposeCall{Id: 2, Cancel: true})
	waitFor(t, "the cancelled call to stop waiting", func() bool { return h.grantWaiters(b) == 0 })

	// A batch: 50 try-acquires by a, one message.
	var batch []*lockpb.ProposeCall
	var ids []uint64
	for i := range 50 {
		id := uint64(100 + i)
		batch = append(batch, call(id, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a, Seq: uint64(2 + i), Name: fmt.Sprintf("y%d", i), Try: true}))
		ids = append(ids, id)
	}
	send(batch...)
	for id, r := range recvReplies(t, st, ids...) {
		if r.GetCode() != lockpb.Code_CODE_OK {
			t.Fatalf("call %d: %v", id, r)
		}
	}

	// a releases x; b's retry (same seq) is granted with a larger token.
	send(call(3, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: b, Seq: 1, Name: "x"}),
		call(4, &lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: a, Seq: 60, Name: "x", Token: held.GetToken()}))
	got := recvReplies(t, st, 3, 4)
	if got[4].GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("release by a: %v", got[4])
	}
	if got[3].GetCode() != lockpb.Code_CODE_OK || got[3].GetToken() <= held.GetToken() {
		t.Fatalf("b's acquire after the release: %v (a's token %d)", got[3], held.GetToken())
	}
}

func (h *harness) grantWaiters(session uint64) int {
	h.svc.mu.Lock()
	defer h.svc.mu.Unlock()
	n := 0
	for _, cs := range h.svc.grants[session] {
		n += len(cs)
	}
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestProposeStreamHalfCloseAndDuplicates: a call whose id is already in
// progress is answered CODE_INVALID (the first one still completes), and a
// client that half-closes still gets every answer in progress before the
// stream ends cleanly.
func TestProposeStreamHalfCloseAndDuplicates(t *testing.T) {
	h := newHarness(t)
	a, b := h.open(time.Hour), h.open(time.Hour)
	st := streamHarness(t, h)
	send := func(calls ...*lockpb.ProposeCall) {
		t.Helper()
		if err := st.Send(&lockpb.ProposeCalls{Calls: calls}); err != nil {
			t.Fatal(err)
		}
	}
	send(call(1, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a, Seq: 1, Name: "x"}))
	held := recvReplies(t, st, 1)[1]

	// b waits for x as call 2; a second call 2 is refused at once.
	send(call(2, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: b, Seq: 1, Name: "x"}))
	waitFor(t, "b's grant waiter", func() bool { return h.grantWaiters(b) == 1 })
	send(call(2, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: b, Seq: 2, Name: "y"}))
	if r := recvReplies(t, st, 2)[2]; r.GetCode() != lockpb.Code_CODE_INVALID {
		t.Fatalf("a second call with id 2 in progress: %v, want CODE_INVALID", r)
	}

	// a releases x (call 3), then the client half-closes: both answers
	// still arrive, then the stream ends.
	send(call(3, &lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: a, Seq: 2, Name: "x", Token: held.GetToken()}))
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	got := recvReplies(t, st, 2, 3)
	if got[3].GetCode() != lockpb.Code_CODE_OK || got[2].GetCode() != lockpb.Code_CODE_OK || got[2].GetToken() <= held.GetToken() {
		t.Fatalf("answers after the half-close: release %v, b's acquire %v", got[3], got[2])
	}
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("after the last answer: %v, want io.EOF", err)
	}
}
