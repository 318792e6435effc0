package quorumlock

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// fakeLock is a Lock server that answers every proposal with answer()
// and counts the proposals it received.
type fakeLock struct {
	lockpb.UnimplementedLockServer
	calls  atomic.Int64
	answer func() *lockpb.Response
}

func (s *fakeLock) Status(context.Context, *lockpb.StatusRequest) (*lockpb.StatusResponse, error) {
	return &lockpb.StatusResponse{}, nil
}

func (s *fakeLock) ProposeStream(st grpc.BidiStreamingServer[lockpb.ProposeCalls, lockpb.ProposeReplies]) error {
	for {
		m, err := st.Recv()
		if err != nil {
			return err
		}
		var out lockpb.ProposeReplies
		for _, c := range m.GetCalls() {
			if c.GetCancel() {
				continue
			}
			s.calls.Add(1)
			out.Replies = append(out.Replies, &lockpb.ProposeReply{Id: c.GetId(), Response: s.answer()})
		}
		if err := st.Send(&out); err != nil {
			return err
		}
	}
}

// notLeaderLock answers every proposal NOT_LEADER with hint (its
// address; "" for none), as a follower does.
type notLeaderLock struct {
	fakeLock
	hint atomic.Pointer[string]
}

func newNotLeaderLock() *notLeaderLock {
	s := &notLeaderLock{}
	s.answer = func() *lockpb.Response {
		return &lockpb.Response{Code: lockpb.Code_CODE_NOT_LEADER, LeaderAddr: *s.hint.Load()}
	}
	return s
}

func serveFake(t *testing.T, s lockpb.LockServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	lockpb.RegisterLockServer(srv, s)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// A follower that still names the old leader, and the old leader, cut off
// from the majority, that has stepped down and names none (the window
// before the majority elects a new leader): the client follows the hint,
// is told "no leader", goes back to the follower, which names the old
// leader again... Each round must back off as when no replica answers; it
// went round at once, a request every round trip, for as long as the
// window lasted (and fired leaderMoved each time, restarting every
// Observe stream of the client).
func TestReviewTodayRedirectLoopBacksOff(t *testing.T) {
	follower, old := newNotLeaderLock(), newNotLeaderLock()
	none := ""
	old.hint.Store(&none)
	fAddr, oAddr := serveFake(t, follower), serveFake(t, old)
	follower.hint.Store(&oAddr)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, []string{fAddr, oAddr}, WithElectionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// With backoff (5 ms doubling to 100 ms) half a second holds about ten
	// rounds, fewer on a slow machine; without it, thousands.
	wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer wcancel()
	if _, err := c.NewSession(wctx); err == nil {
		t.Fatal("NewSession succeeded with no leader")
	}
	if n := follower.calls.Load() + old.calls.Load(); n > 200 {
		t.Fatalf("%d proposals in half a second with no leader to find: the redirect loop does not back off", n)
	}
}
