package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// A session closed by its owner while Acquire calls of it wait in a queue
// is closed, not expired: the waiting calls are answered "no such session"
// by the entry that closed it, and that answer must not turn the
// session's end into "the cluster ended it". Session.Close documents
// that closing an ended session "returns nil if it was closed": a second
// Close, and Closes racing the first, return nil.
func TestReviewNewcomerCloseWithAcquiresWaiting(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := nodes[specLeader(t, nodes)]
	openers := append(specOpeners(t, nodes), struct {
		name string
		o    opener
	}{"leader", lead})
	for _, op := range openers {
		t.Run(op.name, func(t *testing.T) {
			for i := range 5 {
				name := fmt.Sprintf("busy-%s-%d", op.name, i)
				ctx := testCtx(t, 20*time.Second)
				h := newSession(t, lead)
				mustAcquire(t, h, name)
				s, err := op.o.NewSession(ctx)
				if err != nil {
					t.Fatal(err)
				}
				acquired := make(chan error, 3)
				for range 3 {
					go func() {
						_, err := s.Acquire(ctx, name)
						acquired <- err
					}()
				}
				waitQueued(t, lead, name, s.ID())
				closes := make(chan error, 2)
				for range 2 {
					go func() { closes <- s.Close(ctx) }()
				}
				for range 2 {
					if err := <-closes; err != nil {
						t.Errorf("concurrent Close of session %d: %v, want nil", s.ID(), err)
					}
				}
				for range 3 {
					if err := <-acquired; !errors.Is(err, quorumlock.ErrSessionExpired) {
						t.Errorf("waiting Acquire: %v, want ErrSessionExpired", err)
					}
				}
				if err := s.Close(ctx); err != nil {
					t.Fatalf("Close of the closed session %d: %v, want nil", s.ID(), err)
				}
				if err := h.Close(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// Start that fails after registering the replica's metrics (here: its
// address is taken) removes them again: a scrape must not show a replica
// that never ran, and the caller may retry Start with the same registry
// once the address is free.
func TestReviewNewcomerFailedStartUnregistersMetrics(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	reg := prometheus.NewRegistry()
	cfg := quorumlock.Config{
		ID:            1,
		Peers:         map[uint64]string{1: taken.Addr().String()},
		DataDir:       t.TempDir(),
		TickInterval:  20 * time.Millisecond,
		ElectionTicks: 10,
		Metrics:       reg,
	}
	if n, err := quorumlock.Start(testCtx(t, 10*time.Second), cfg); err == nil {
		n.Close()
		t.Fatal("Start on a taken address succeeded")
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		t.Errorf("metric %s registered by a Start that failed", f.GetName())
	}
	taken.Close()
	n, err := quorumlock.Start(testCtx(t, 10*time.Second), cfg)
	if err != nil {
		t.Fatalf("Start again with the same registry, the address now free: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}

// A session whose Acquire calls wait for long, more of them than the 32
// a request could list as in flight, goes on working: a worker pool of 40
// goroutines each waiting for its own busy lock on one session, while
// another goroutine takes and frees a lock in a loop. With a request
// listing at most 32 others in flight, the rest went out with the lowest
// seq in flight alone, which pinned every later outcome in the session's
// table: after 1,024 of them (about 500 cycles) every request of the
// session failed with ErrLimit, though no documented limit was near.
func TestReviewNewcomerManyWaitsDoNotPinOutcomes(t *testing.T) {
	t.Parallel()
	nodes := specCluster(t, 3, nil)
	lead := nodes[specLeader(t, nodes)]
	ctx := testCtx(t, 60*time.Second)
	h := newSession(t, lead)
	s := newSession(t, lead)
	const waits = 40
	for i := range waits {
		mustAcquire(t, h, fmt.Sprintf("busy%d", i))
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	waited := make(chan error, waits)
	for i := range waits {
		go func() {
			_, err := s.Acquire(wctx, fmt.Sprintf("busy%d", i))
			waited <- err
		}()
	}
	for i := range waits {
		waitQueued(t, lead, fmt.Sprintf("busy%d", i), s.ID())
	}
	for i := range 600 { // 1,200 requests while 40 acquires wait
		l, err := s.Acquire(ctx, "work")
		if err != nil {
			t.Fatalf("Acquire #%d while %d acquires wait: %v", i, waits, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release #%d while %d acquires wait: %v", i, waits, err)
		}
	}
	stop()
	for range waits {
		if err := <-waited; !errors.Is(err, context.Canceled) {
			t.Errorf("a waiting acquire after its cancellation: %v", err)
		}
	}
	for i := range waits {
		if info := holder(t, lead, fmt.Sprintf("busy%d", i)); len(info.Waiters) != 0 {
			t.Errorf("a cancelled acquire is still queued: %+v", info)
		}
	}
}

// Closing the session of a leader ends its leadership as Resign does:
// Done closes before the close is sent, so before the next candidate can
// be elected. Done documents one exception to "closes before any other
// candidate can be elected", an operator's revocation; a Session.Close by
// the leader's own process let the next candidate lead while the old
// leader's Context stayed live until the close's answer came back.
func TestReviewNewcomerSessionCloseEndsLeadershipBeforeNextElected(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	const clientID = 100
	cl := dial(t, addrsOf(c, lead), quorumlock.WithDialer(c.Net.Dialer(clientID)))
	for _, owned := range []bool{false, true} {
		role := fmt.Sprintf("sched-owned-%v", owned)
		var la *quorumlock.Leadership
		if owned {
			var err error
			if la, err = cl.Elect(testCtx(t, 10*time.Second), role, []byte("old")); err != nil {
				t.Fatal(err)
			}
		} else {
			old, err := cl.NewSession(testCtx(t, 10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			la = mustElect(t, old, role, "old")
		}
		next := newSession(t, c.Node(lead))
		got := electAfter(t, next, role, la)
		waitCandidate(t, c.Node(lead), role, next.ID())
		// The old leader's process hears the cluster's answers late.
		c.Net.SetDelay(lead, clientID, 100*time.Millisecond)
		if err := la.Session().Close(testCtx(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		c.Net.Heal()
		e := <-got
		if e.ld == nil {
			t.FailNow()
		}
		if !e.oldEnded {
			t.Errorf("owned %v: epoch %d elected while the leader whose session closed (epoch %d) still had a live Done/Context",
				owned, e.ld.Epoch(), la.Epoch())
		}
	}
}

// A Proclaim the cluster refuses because the session has too many
// requests pending (1,024 waiting acquires here) returns sentinels, as
// Release does in the same case: ErrLimit wrapped with ErrUnknownOutcome
// (another copy of the request may still take effect). It returned
// "quorumlock: proclaim ...: CODE_LIMIT", which no errors.Is matches.
func TestReviewNewcomerProclaimRefusedForPendingIsSentinel(t *testing.T) {
	t.Parallel()
	nodes := specCluster(t, 3, nil)
	lead := nodes[specLeader(t, nodes)]
	ctx := testCtx(t, 60*time.Second)
	h := newSession(t, lead)
	s := newSession(t, lead)
	ld := mustElect(t, s, "r", "v")
	const waits = 1024 // the cluster remembers at most 1,024 outcomes per session
	for i := range waits {
		mustAcquire(t, h, fmt.Sprintf("busy%d", i))
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for i := range waits {
		go s.Acquire(wctx, fmt.Sprintf("busy%d", i))
	}
	for i := range waits {
		waitQueued(t, lead, fmt.Sprintf("busy%d", i), s.ID())
	}
	err := ld.Proclaim(ctx, []byte("w"))
	if !errors.Is(err, quorumlock.ErrLimit) || !errors.Is(err, quorumlock.ErrUnknownOutcome) {
		t.Fatalf("Proclaim with %d requests of the session pending: %v, want ErrLimit and ErrUnknownOutcome", waits, err)
	}
}
