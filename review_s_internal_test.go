package quorumlock

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// scriptedLock is a Lock server whose ProposeStream reports every call it
// receives and sends the replies the test gives it.
type scriptedLock struct {
	lockpb.UnimplementedLockServer
	calls   chan *lockpb.ProposeCall
	replies chan *lockpb.ProposeReply
}

func (s *scriptedLock) ProposeStream(st grpc.BidiStreamingServer[lockpb.ProposeCalls, lockpb.ProposeReplies]) error {
	go func() {
		for {
			select {
			case r := <-s.replies:
				if st.Send(&lockpb.ProposeReplies{Replies: []*lockpb.ProposeReply{r}}) != nil {
					return
				}
			case <-st.Context().Done():
				return
			}
		}
	}()
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

// reviewSStream is a propStream for the holder of opens to a scriptedLock.
type reviewSStream struct {
	t     *testing.T
	ctx   context.Context
	fake  *scriptedLock
	ps    *propStream
	opens *openCalls
	mark  uint64 // session of the last marker call
}

func newReviewSStream(t *testing.T) *reviewSStream {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	fake := &scriptedLock{calls: make(chan *lockpb.ProposeCall, 64), replies: make(chan *lockpb.ProposeReply, 64)}
	lockpb.RegisterLockServer(srv, fake)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	opens := newOpenCalls()
	ps, err := openPropStream(ctx, cc, opens)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ps.close)
	return &reviewSStream{t: t, ctx: ctx, fake: fake, ps: ps, opens: opens, mark: 1000}
}

func (r *reviewSStream) next(what string) *lockpb.ProposeCall {
	r.t.Helper()
	select {
	case c := <-r.fake.calls:
		return c
	case <-r.ctx.Done():
		r.t.Fatalf("server did not receive %s", what)
		return nil
	}
}

// abandonedOpen sends an open attempt of openID whose caller gives up
// before its answer, and returns the attempt's call id.
func (r *reviewSStream) abandonedOpen(openID uint64) uint64 {
	r.t.Helper()
	actx, cancel := context.WithCancel(r.ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := r.ps.call(actx, nil, &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: 10_000, OpenId: openID})
		errc <- err
	}()
	sent := r.next("the open")
	cancel()
	<-errc
	if c := r.next("the cancel"); !c.GetCancel() || c.GetId() != sent.GetId() {
		r.t.Fatalf("got %v, want the cancel of call %d", c, sent.GetId())
	}
	return sent.GetId()
}

// answer sends the answer "session id" to call.
func (r *reviewSStream) answer(call, id uint64) {
	r.fake.replies <- &lockpb.ProposeReply{Id: call, Response: &lockpb.Response{Code: lockpb.Code_CODE_OK, Session: id}}
}

// closes answers a marker call (every answer before it is then handled)
// and a second one (everything queued before it is then sent), and
// returns the sessions the stream closed meanwhile.
func (r *reviewSStream) closes() []uint64 {
	r.t.Helper()
	var closed []uint64
	for range 2 {
		r.mark++
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.ps.call(r.ctx, nil, &lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: r.mark, Seq: 1, Name: "m"})
		}()
		for {
			c := r.next("the marker")
			if c.GetRequest().GetSession() == r.mark {
				r.fake.replies <- &lockpb.ProposeReply{Id: c.GetId(), Response: &lockpb.Response{Code: lockpb.Code_CODE_NOT_HELD}}
				break
			}
			if c.GetRequest().GetOp() != lockpb.Op_OP_CLOSE_SESSION {
				r.t.Fatalf("unexpected call %v", c)
			}
			closed = append(closed, c.GetRequest().GetSession())
		}
		<-done
	}
	return closed
}

// The answer of an abandoned open attempt that comes late names a
// session that another attempt of the same NewSession call may get (the
// cluster deduplicates the call's attempts by open ID): the stream must
// not close it while the call goes on, nor once the call succeeded (it is
// the caller's session). Before, it closed it at once: the retry that
// received the same session then had it ended by its own client.
func TestReviewSLateOpenAnswerSpared(t *testing.T) {
	r := newReviewSStream(t)
	openID := r.opens.start()
	first := r.abandonedOpen(openID)
	r.answer(first, 42) // late: the call goes on
	if got := r.closes(); len(got) != 0 {
		t.Fatalf("closed %v while the call goes on", got)
	}
	// The retry gets the same session; the call succeeds.
	resp := make(chan *lockpb.Response, 1)
	go func() {
		rsp, _ := r.ps.call(r.ctx, nil, &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: 10_000, OpenId: openID})
		resp <- rsp
	}()
	retry := r.next("the retry")
	r.answer(retry.GetId(), 42)
	if got := <-resp; got.GetSession() != 42 {
		t.Fatalf("retry answered %v", got)
	}
	r.opens.end(openID, true)
	// Another abandoned attempt's answer, after the call succeeded.
	late := r.abandonedOpen(openID)
	r.answer(late, 42)
	if got := r.closes(); len(got) != 0 {
		t.Fatalf("closed %v, the session the call received", got)
	}
}

// A call that fails (its ctx ended, every attempt abandoned) has no taker
// for the sessions its attempts opened: those whose answers came while it
// went on are closed when it fails, and those whose answers come after
// at once, as is every late answer of an open without an open ID.
func TestReviewSLateOpenAnswerOfFailedCallClosed(t *testing.T) {
	r := newReviewSStream(t)
	openID := r.opens.start()
	a := r.abandonedOpen(openID)
	r.answer(a, 50)
	if got := r.closes(); len(got) != 0 {
		t.Fatalf("closed %v while the call goes on", got)
	}
	b := r.abandonedOpen(openID)
	r.opens.end(openID, false)
	if got := r.closes(); len(got) != 1 || got[0] != 50 {
		t.Fatalf("closed %v when the call failed, want [50]", got)
	}
	r.answer(b, 51)
	if got := r.closes(); len(got) != 1 || got[0] != 51 {
		t.Fatalf("closed %v after the call failed, want [51]", got)
	}
	c := r.abandonedOpen(0)
	r.answer(c, 52)
	if got := r.closes(); len(got) != 1 || got[0] != 52 {
		t.Fatalf("closed %v for an open without an ID, want [52]", got)
	}
}
