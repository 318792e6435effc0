package quorumlock

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// closeGate passes requests to a real replica's router, except that it can
// hold back the answers of the next acquire and of the next close (as a
// slow network does): each is applied, and its answer waits for the test.
type closeGate struct {
	backend

	mu                           sync.Mutex
	holdAcquire, holdClose       bool
	acquireApplied, closeApplied chan struct{}
	letAcquire, letClose         chan struct{}
}

func (g *closeGate) propose(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
	g.mu.Lock()
	holdA := g.holdAcquire && req.GetOp() == lockpb.Op_OP_ACQUIRE
	if holdA {
		g.holdAcquire = false
	}
	holdC := g.holdClose && req.GetOp() == lockpb.Op_OP_CLOSE_SESSION
	if holdC {
		g.holdClose = false
	}
	g.mu.Unlock()
	resp, err := g.backend.propose(context.WithoutCancel(ctx), req)
	switch {
	case holdA:
		close(g.acquireApplied)
		<-g.letAcquire
	case holdC:
		close(g.closeApplied)
		<-g.letClose
	}
	return resp, err
}

// TestElectAnsweredDuringCloseIsOver: Session.Close ends the session's
// leaderships before its close can elect the next candidate (Leadership.Done
// closes before any other candidate is elected). A Session.Elect whose
// grant is answered while Close is under way (applied before the close,
// answered after it) made a Leadership that Close did not know of: its
// Done stayed open while the next candidate, elected by the close, led.
func TestElectAnsweredDuringCloseIsOver(t *testing.T) {
	n, _ := startOne(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	g := &closeGate{backend: n.router, acquireApplied: make(chan struct{}), closeApplied: make(chan struct{}),
		letAcquire: make(chan struct{}), letClose: make(chan struct{})}
	s, err := openSession(ctx, g, newOpenCalls(), n.hb, n.cfg.Clock, 3*time.Second, n.cfg.MaxNameBytes)
	if err != nil {
		t.Fatal(err)
	}
	other, err := n.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())

	type elected struct {
		ld  *Leadership
		err error
	}
	g.mu.Lock()
	g.holdAcquire = true
	g.mu.Unlock()
	electc := make(chan elected, 1)
	go func() {
		ld, err := s.Elect(ctx, "role", nil)
		electc <- elected{ld, err}
	}()
	<-g.acquireApplied // s leads "role" on the cluster; Elect has no answer yet

	g.mu.Lock()
	g.holdClose = true
	g.mu.Unlock()
	closec := make(chan error, 1)
	go func() { closec <- s.Close(ctx) }()
	<-g.closeApplied // the close freed "role"

	next, err := other.Elect(ctx, "role", nil)
	if err != nil {
		t.Fatalf("the next candidate was not elected after the close: %v", err)
	}
	close(g.letAcquire)
	e := <-electc
	if e.err == nil {
		select {
		case <-e.ld.Done():
		default:
			t.Errorf("Elect answered during Close returned a leadership whose Done is open while the next candidate leads (epoch %d, next epoch %d)",
				e.ld.Epoch(), next.Epoch())
		}
	}
	close(g.letClose)
	if err := <-closec; err != nil {
		t.Fatalf("Close: %v", err)
	}
}
