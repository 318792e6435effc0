package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// Every blocking call is bounded by its context (DESIGN.md invariant 12),
// also while it waits between two attempts that found no leader. With a
// 2 s election timeout that wait grows to 200 ms (backoffCap), so a call
// cancelled during it must return at the cancel, not at the wait's end.
// A replica cut off from the rest serves calls of its own (the router's
// retry loop); then, with every replica stopped, a Client makes calls
// (the client's loops: each attempt is refused at once). Each call is
// cancelled at its own moment 0.7-1.2 s into it; the median delay
// from the cancel to the return must stay well under the backoff. The
// bound (30 ms) is on the median of seven calls of each kind, so that a
// call or two a loaded machine wakes late does not fail it, while a wait
// that ignored the cancel would add 0-200 ms to each (and so still pass
// in about one run in a hundred). (An interrupted
// acquire is not among the calls: it settles its outcome after a
// cancellation, for up to an election timeout, see Session.Acquire.)
func TestCancelEndsRetryBackoff(t *testing.T) {
	const election = 2 * time.Second
	c := testcluster.New(t, testcluster.Options{Size: 3, TickInterval: 100 * time.Millisecond, ElectionTicks: 20, SessionTTL: 30 * time.Second})
	lead := c.WaitLeader(15 * time.Second)
	x := follower(c, lead)
	n := c.Node(x)
	cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithElectionTimeout(election), quorumlock.WithSessionTTL(30*time.Second))
	s := newSession(t, n)
	cs := newSession(t, cl)
	var locks, clocks []*quorumlock.Lock
	for i := range 7 {
		locks = append(locks, mustAcquire(t, s, fmt.Sprint("held/", i)))
		clocks = append(clocks, mustAcquire(t, cs, fmt.Sprint("client/", i)))
	}
	for _, id := range c.IDs() {
		if id != x {
			c.Stop(id)
		}
	}

	type call struct {
		side string
		do   func(ctx context.Context) error
	}
	var replica, client []call
	for i := range 7 {
		replica = append(replica,
			call{"replica NewSession", func(ctx context.Context) error { _, err := n.NewSession(ctx); return err }},
			call{"replica Release", func(ctx context.Context) error { return locks[i].Release(ctx) }},
		)
		client = append(client,
			call{"client Holder", func(ctx context.Context) error { _, err := cl.Holder(ctx, fmt.Sprint("held/", i)); return err }},
			call{"client Release", func(ctx context.Context) error { return clocks[i].Release(ctx) }},
		)
	}
	late := map[string][]time.Duration{}
	var mu sync.Mutex
	run := func(calls []call) {
		var wg sync.WaitGroup
		for i, cc := range calls {
			wg.Go(func() {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				errc := make(chan error, 1)
				go func() { errc <- cc.do(ctx) }()
				select {
				case err := <-errc:
					t.Errorf("%s call %d returned before its cancel: %v", cc.side, i, err)
					return
				case <-time.After(700*time.Millisecond + time.Duration(i)*37*time.Millisecond):
				}
				cancel()
				cancelled := time.Now()
				select {
				case err := <-errc:
					d := time.Since(cancelled)
					if !errors.Is(err, context.Canceled) && !errors.Is(err, quorumlock.ErrUnknownOutcome) {
						t.Errorf("%s call %d: %v, want context.Canceled or ErrUnknownOutcome", cc.side, i, err)
					}
					mu.Lock()
					late[cc.side] = append(late[cc.side], d)
					mu.Unlock()
				case <-time.After(5 * time.Second):
					t.Errorf("%s call %d still running 5 s after its cancel", cc.side, i)
				}
			})
		}
		wg.Wait()
	}
	run(replica)
	c.Stop(x)
	run(client)
	for side, ds := range late {
		slices.Sort(ds)
		if med := ds[len(ds)/2]; med > 30*time.Millisecond {
			t.Errorf("%s calls returned a median %v after their cancel (all: %v), want well under the 200 ms backoff", side, med, ds)
		}
	}
}
