package quorumlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
)

// A Resign whose release went unconfirmed (ctx ended) leaves the grant
// held, and Elect then returns a new Leadership for it (documented). Calling
// the old handle's Resign again, to settle the release, gives up that same
// grant: the new handle's Done must close before the release is sent, as
// Resign promises for the leadership it ends, not only once the release is
// answered (after the next candidate may have been elected). Here the
// release cannot be answered (the followers are stopped), and the new
// handle's Done stayed open for as long as it was pending.
func TestReviewLResignOfAnOldHandleEndsTheNewOne(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	ctx := testCtx(t, 30*time.Second)
	s := specSession(ctx, t, nodes[lead], quorumlock.WithTTL(20*time.Second))
	ld1, err := s.Elect(ctx, "lrole", nil)
	if err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := ld1.Resign(ended); !errors.Is(err, quorumlock.ErrUnknownOutcome) {
		t.Fatalf("Resign with an ended ctx: %v, want ErrUnknownOutcome", err)
	}
	ld2, err := s.Elect(ctx, "lrole", nil)
	if err != nil {
		t.Fatal(err)
	}
	if ld2 == ld1 || ld2.Epoch() != ld1.Epoch() {
		t.Fatalf("Elect after an unconfirmed Resign: same handle %v, epochs %d and %d", ld2 == ld1, ld1.Epoch(), ld2.Epoch())
	}
	select {
	case <-ld2.Done():
		t.Fatal("the new leadership is over before anything gave it up")
	default:
	}
	// No quorum: the release is never answered.
	for i, n := range nodes {
		if i != lead {
			n.Close()
		}
	}
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	resigned := make(chan error, 1)
	go func() { resigned <- ld1.Resign(rctx) }()
	select {
	case <-ld2.Done():
	case err := <-resigned:
		t.Fatalf("Resign returned %v without a quorum", err)
	case <-time.After(3 * time.Second):
		t.Fatal("the new handle's Done stayed open while a Resign of the same grant was in flight")
	}
	rcancel()
	<-resigned
	// Without a quorum the close is not answered: end the session here
	// rather than in the cleanup's 10 s wait.
	cctx, ccancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer ccancel()
	s.Close(cctx)
}

// Session.Elect on the session Node.Elect or Client.Elect opened for a
// role (Leadership.Session) returns that leadership, as it does for a
// session that already leads the role: it returned a second open handle
// of the same grant, whose Done stayed open after the first one resigned.
func TestReviewLElectOnAnOwnedSessionReturnsItsLeadership(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	for _, op := range specOpeners(t, nodes) {
		t.Run(op.name, func(t *testing.T) {
			ctx := testCtx(t, 20*time.Second)
			var elect func(context.Context, string, []byte) (*quorumlock.Leadership, error)
			switch o := op.o.(type) {
			case *quorumlock.Node:
				elect = o.Elect
			case *quorumlock.Client:
				elect = o.Elect
			}
			ld, err := elect(ctx, "lowned", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ld.Resign(ctx)
			again, err := ld.Session().Elect(ctx, "lowned", nil)
			if err != nil {
				t.Fatal(err)
			}
			if again != ld {
				again.Resign(ctx)
				t.Fatal("Session.Elect on the leadership's own session returned a second handle of the grant")
			}
		})
	}
}
