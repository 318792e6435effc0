package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// reviewNRound runs one round of a long run through o: two sessions
// opened and closed, a lock name used once (held, tried by the other
// session, waited for by it until its ctx is cancelled, released), a role
// won and resigned with the session, and one won and resigned with a
// session of its own (Elect on o).
func reviewNRound(t *testing.T, o opener, i int) {
	t.Helper()
	ctx := testCtx(t, 20*time.Second)
	name, role := fmt.Sprintf("long/%d", i), fmt.Sprintf("role/%d", i)
	a, err := o.NewSession(ctx)
	if err != nil {
		t.Fatalf("round %d: NewSession: %v", i, err)
	}
	b, err := o.NewSession(ctx)
	if err != nil {
		t.Fatalf("round %d: NewSession: %v", i, err)
	}
	l := mustAcquire(t, a, name)
	if _, err := b.TryAcquire(ctx, name); !errors.Is(err, quorumlock.ErrLocked) {
		t.Fatalf("round %d: TryAcquire of a held lock = %v, want ErrLocked", i, err)
	}
	actx, cancel := context.WithCancel(ctx)
	ch := acquireQueued(t, actx, b, o, name)
	cancel()
	if r := <-ch; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("round %d: cancelled Acquire = %v, want context.Canceled", i, r.err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("round %d: Release: %v", i, err)
	}
	ld, err := a.Elect(ctx, role, []byte("v"))
	if err != nil {
		t.Fatalf("round %d: Session.Elect: %v", i, err)
	}
	if err := ld.Resign(ctx); err != nil {
		t.Fatalf("round %d: Resign: %v", i, err)
	}
	ld, err = o.Elect(ctx, role+"/own", []byte("v"))
	if err != nil {
		t.Fatalf("round %d: Elect: %v", i, err)
	}
	if err := ld.Resign(ctx); err != nil {
		t.Fatalf("round %d: Resign: %v", i, err)
	}
	for _, s := range []*quorumlock.Session{a, b} {
		if err := s.Close(ctx); err != nil {
			t.Fatalf("round %d: Close: %v", i, err)
		}
	}
}

func reviewNGoroutines() int {
	// Let goroutines that are finishing (a call's stream handler, a
	// background close) end.
	deadline := time.Now().Add(3 * time.Second)
	n := runtime.NumGoroutine()
	for time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m == n {
			return n
		}
		n = m
	}
	return n
}

// reviewNGoroutinesBackTo waits (up to 20 s) for the goroutine count to
// come down to limit and returns the last count, with the stacks of the
// goroutines running then when it is still above. Goroutines that are
// finishing (stream handlers, background closes, heartbeat streams being
// replaced) may take seconds to be scheduled on a loaded machine under
// -race, longer than reviewNGoroutines' 50 ms of a steady count; a leak
// stays above limit for good.
func reviewNGoroutinesBackTo(limit int) (int, string) {
	g := reviewNGoroutines()
	for deadline := time.Now().Add(20 * time.Second); g > limit && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		g = runtime.NumGoroutine()
	}
	if g <= limit {
		return g, ""
	}
	var b strings.Builder
	pprof.Lookup("goroutine").WriteTo(&b, 1)
	return g, b.String()
}

// TestReviewNLongRunReturnsToBounds: after hundreds of rounds of sessions
// opened and closed, lock names used once, cancelled waits, tries and
// elections, through a follower replica and a remote client, nothing that
// a Node or Client keeps per session or per call is left (heartbeated
// sessions, propose and heartbeat stream waiters), the cluster holds no
// session and no lock, and the goroutine count is back where it was after
// the first rounds (a few goroutines of slack for streams being replaced).
func TestReviewNLongRunReturnsToBounds(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(10 * time.Second)
	f := c.Node(follower(c, lead))
	cl := dial(t, addrsOf(c, c.IDs()...))
	openers := []struct {
		name string
		o    opener
		sz   any
	}{{"follower", f, f}, {"client", cl, cl}}
	const warm, rounds = 5, 300 / reviewNScale
	for _, o := range openers {
		for i := range warm {
			reviewNRound(t, o.o, i)
		}
	}
	g0 := reviewNGoroutines()
	// What an opener keeps per replica address (a connection, its
	// propose and heartbeat streams) may grow during the rounds: a call
	// timed out on a loaded machine moves on to another replica and opens
	// them there. Their goroutines (gRPC's on both sides, the streams'
	// loops and handlers: 14 for a connection and a propose stream) are
	// allowed for on top of the slack; per session or per call, 75 rounds
	// would leave more.
	perAddr := func() (n int) {
		for _, o := range openers {
			sz := quorumlock.ReviewNSizes(o.sz)
			n += 12*sz["conns"] + 8*(sz["propose streams"]+sz["ka streams"])
		}
		return n
	}
	a0 := perAddr()
	for _, o := range openers {
		for i := warm; i < warm+rounds; i++ {
			reviewNRound(t, o.o, i)
		}
	}
	for _, o := range openers {
		for k, v := range quorumlock.ReviewNSizes(o.sz) {
			if k == "conns" || k == "away" || k == "propose streams" || k == "ka streams" { // per replica address
				if v > 3 {
					t.Errorf("%s: %s = %d, want at most one per replica", o.name, k, v)
				}
				continue
			}
			if v != 0 {
				t.Errorf("%s: %s = %d after every session closed, want 0", o.name, k, v)
			}
		}
	}
	ctx := testCtx(t, 10*time.Second)
	if ss, _, err := cl.Sessions(ctx, 0, 100); err != nil || len(ss) != 0 {
		t.Errorf("Sessions = %v, %v; want none", ss, err)
	}
	if ls, _, err := cl.Locks(ctx, "", 100); err != nil || len(ls) != 0 {
		t.Errorf("Locks = %v, %v; want none", ls, err)
	}
	limit := g0 + 10 + max(0, perAddr()-a0)
	if g1, stacks := reviewNGoroutinesBackTo(limit); g1 > limit {
		t.Errorf("goroutines: %d after %d rounds, %d after the first %d (at most %d with the replica connections and streams opened since); running:\n%s", g1, rounds, g0, warm, limit, stacks)
	}
}
