package quorumlock

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// mutedLock is a Lock server that takes proposals and never answers them,
// as a replica that is paused or black-holed (with its connection up)
// does; it counts the proposals it received.
type mutedLock struct {
	lockpb.UnimplementedLockServer
	calls atomic.Int64
}

func (s *mutedLock) Status(context.Context, *lockpb.StatusRequest) (*lockpb.StatusResponse, error) {
	return &lockpb.StatusResponse{}, nil
}

func (s *mutedLock) ProposeStream(st grpc.BidiStreamingServer[lockpb.ProposeCalls, lockpb.ProposeReplies]) error {
	for {
		m, err := st.Recv()
		if err != nil {
			return err
		}
		for _, c := range m.GetCalls() {
			if !c.GetCancel() {
				s.calls.Add(1)
			}
		}
	}
}

// newOKLock is a Lock server that answers every proposal OK (token 7),
// as the leader does a grant.
func newOKLock() *fakeLock {
	return &fakeLock{answer: func() *lockpb.Response {
		return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 7}
	}}
}

// A blocking acquire sent while the client knew no leader (a call's
// timeout at the leader A made it forget A) goes to another replica B; if
// B is silent (paused, black-holed), the acquire waits there. When the
// heartbeats then learn that A leads, the acquire must move to A at once,
// as it does when any other leader is learned: it waits at a replica that
// is not the leader. Learning A again was taken for "no move" because A
// was the last leader the client had moved to, and the
// acquire stayed at B until keepalive noticed, 10-20 s (never, here: B's
// connection is healthy), or its ctx ended.
func TestReviewLForgottenLeaderLearnedAgainMovesCallsElsewhere(t *testing.T) {
	leader, silent := newOKLock(), &mutedLock{}
	aAddr, bAddr := serveFake(t, leader), serveFake(t, silent)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Dial(ctx, []string{aAddr, bAddr}, WithElectionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	c.setLeader(aAddr) // a heartbeat answered by A
	c.rotate(aAddr)    // a call's ctx ended at A: the client forgets it
	if got := c.pick(); got != bAddr {
		t.Fatalf("after rotate, pick %q, want B %q", got, bAddr)
	}

	type result struct {
		resp *lockpb.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		actx, acancel := context.WithTimeout(ctx, 15*time.Second)
		defer acancel()
		resp, err := c.propose(actx, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: 1, Seq: 1, Name: "x"})
		done <- result{resp, err}
	}()
	for deadline := time.Now().Add(5 * time.Second); silent.calls.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the acquire never reached B")
		}
	}

	c.setLeader(aAddr) // a heartbeat answered by A again
	select {
	case r := <-done:
		if r.err != nil || r.resp.GetCode() != lockpb.Code_CODE_OK {
			t.Fatalf("acquire: %v, %v", r.resp, r.err)
		}
		if leader.calls.Load() == 0 {
			t.Fatal("answered without reaching the leader")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the acquire stayed at the silent replica B after the client learned that A leads")
	}
}
