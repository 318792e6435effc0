package quorumlock

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// silentLock is a Lock server whose ProposeStream never answers; it
// reports every call it receives.
type silentLock struct {
	lockpb.UnimplementedLockServer
	calls chan *lockpb.ProposeCall
}

func (s *silentLock) ProposeStream(st grpc.BidiStreamingServer[lockpb.ProposeCalls, lockpb.ProposeReplies]) error {
	for {
		m, err := st.Recv()
		if err != nil {
			return err
		}
		for _, c := range m.GetCalls() {
			s.calls <- c
		}
	}
}

// A call on a propose stream ends when its abort channel closes (a new
// leader: the router re-sends the request there) with errAborted, or when
// its context ends with the context's error; either way the server is told
// to stop waiting for it.
func TestPropStreamCallAbandoned(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	fake := &silentLock{calls: make(chan *lockpb.ProposeCall, 16)}
	lockpb.RegisterLockServer(srv, fake)
	go srv.Serve(lis)
	defer srv.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ps, err := openPropStream(ctx, cc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ps.close()

	next := func(what string) *lockpb.ProposeCall {
		t.Helper()
		select {
		case c := <-fake.calls:
			return c
		case <-ctx.Done():
			t.Fatalf("server did not receive %s", what)
			return nil
		}
	}
	req := &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: 1, Seq: 1, Name: "x"}

	abort := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		_, err := ps.call(ctx, abort, req)
		errc <- err
	}()
	sent := next("the call")
	close(abort)
	if err := <-errc; !errors.Is(err, errAborted) {
		t.Fatalf("call after abort: %v, want errAborted", err)
	}
	if c := next("the cancel"); !c.GetCancel() || c.GetId() != sent.GetId() {
		t.Fatalf("after abort the server got %v, want a cancel of call %d", c, sent.GetId())
	}

	cctx, ccancel := context.WithCancel(ctx)
	go func() {
		_, err := ps.call(cctx, nil, req)
		errc <- err
	}()
	sent = next("the second call")
	ccancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("call after its context ended: %v, want context.Canceled", err)
	}
	if c := next("the second cancel"); !c.GetCancel() || c.GetId() != sent.GetId() {
		t.Fatalf("after cancel the server got %v, want a cancel of call %d", c, sent.GetId())
	}
}
