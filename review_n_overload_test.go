package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/service"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// TestReviewNOverloadOneLock: 1,500 sessions (over three clients and a
// follower replica) wait at once for one held lock with MaxWaitersPerLock
// 500: exactly 500 queue and the others get ErrLimit. Cancelling every
// waiter empties the queue on the leader and on every replica, leaves no
// goroutine behind, and the cluster then serves as before: the lock goes
// to a new waiter on release, and a session can take 500 new places.
func TestReviewNOverloadOneLock(t *testing.T) {
	const sessions, maxWaiters = 3000 / reviewNScale, 1000 / reviewNScale
	// The test is about the waiter limit, not about timing: a 1 s
	// election timeout (not the default 100 ms) that the clients are
	// told of. Under -race on a loaded host, 750 opens at once delayed
	// the leader's heartbeats past 100 ms (new leaders, sessions that
	// expired) and outlasted the clients' 200 ms attempts, whose opens
	// sent again filled MaxSessions (ErrLimit "sessions") or never got
	// through in 50 s.
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 10 * time.Second, ElectionTicks: 100, Configure: func(cfg *quorumlock.Config) {
		cfg.MaxWaitersPerLock = maxWaiters
		cfg.MaxSessions = 2 * sessions
	}})
	lead := c.WaitLeader(10 * time.Second)
	f := c.Node(follower(c, lead))
	var openers []opener
	for range 3 {
		// The cluster's TTL, not dial's 2 s: the test is about limits,
		// and under -race on a loaded host 750 sessions' heartbeats
		// could miss a 2 s lease (CI run of 2026-12-01).
		openers = append(openers, dial(t, addrsOf(c, c.IDs()...), quorumlock.WithSessionTTL(10*time.Second), quorumlock.WithElectionTimeout(c.ElectionTimeout())))
	}
	openers = append(openers, f)
	ctx := testCtx(t, 50*time.Second)
	h := newSession(t, c.Node(lead))
	hot := mustAcquire(t, h, "hot")

	ss := make([]*quorumlock.Session, sessions)
	var wg sync.WaitGroup
	for i := range ss {
		wg.Go(func() {
			s, err := openers[i%len(openers)].NewSession(ctx)
			if err != nil {
				t.Errorf("NewSession %d: %v", i, err)
				return
			}
			ss[i] = s
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// The second round must leave as many goroutines as the first: the
	// first opens the streams of each client and replica.
	var g0 int
	for round := range 2 {
		reviewNWaitAndCancel(t, ctx, c, lead, ss, maxWaiters)
		if round == 0 {
			g0 = reviewNGoroutines()
		}
	}

	// The cluster serves as before.
	next := ss[0]
	got := acquireQueued(t, ctx, next, openers[0], "hot")
	if err := hot.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("Acquire after the load: %v", r.err)
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i, s := range ss {
		wg.Go(func() {
			l, err := s.TryAcquire(ctx, fmt.Sprint("after/", i))
			if err != nil {
				t.Errorf("TryAcquire after the load: %v", err)
				return
			}
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release after the load: %v", err)
			}
		})
	}
	wg.Wait()
	for _, s := range ss {
		wg.Go(func() {
			if err := s.Close(ctx); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
	wg.Wait()
	if g1, stacks := reviewNGoroutinesBackTo(g0 + 20); g1 > g0+20 {
		t.Errorf("goroutines: %d after the load, %d before; running:\n%s", g1, g0, stacks)
	}
	if n, _ := c.Node(lead).Status(), 0; n.Leader == 0 {
		t.Errorf("no leader after the load")
	}
}

// reviewNWaitAndCancel has every session of ss wait for "hot" (held by
// another), checks that maxWaiters queue and the others get ErrLimit, then
// cancels them all and checks that no replica keeps a waiter.
func reviewNWaitAndCancel(t *testing.T, ctx context.Context, c *testcluster.Cluster, lead uint64, ss []*quorumlock.Session, maxWaiters int) {
	t.Helper()
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	sessions := int64(len(ss))
	var limited, other atomic.Int64
	var waiting sync.WaitGroup
	for _, s := range ss {
		waiting.Go(func() {
			_, err := s.Acquire(actx, "hot")
			switch {
			case errors.Is(err, quorumlock.ErrLimit):
				limited.Add(1)
			case errors.Is(err, context.Canceled):
			default:
				other.Add(1)
				t.Errorf("Acquire: %v", err)
			}
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for limited.Load() < sessions-int64(maxWaiters) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := len(holder(t, c.Node(lead), "hot").Waiters); got != maxWaiters || limited.Load() != sessions-int64(maxWaiters) {
		t.Fatalf("%d waiters and %d ErrLimit, want %d and %d", got, limited.Load(), maxWaiters, sessions-int64(maxWaiters))
	}
	cancel()
	waiting.Wait()
	for _, id := range c.IDs() {
		if w := holder(t, c.Node(id), "hot").Waiters; len(w) != 0 {
			t.Errorf("replica %d: %d waiters left after every waiter's ctx ended", id, len(w))
		}
	}
	for _, s := range ss {
		if s.Err() != nil {
			t.Fatalf("a session ended under the load: %v", s.Err())
		}
	}

}

// listedSessions returns the IDs of the cluster's live sessions, as cl
// reads them (every page).
func listedSessions(t *testing.T, ctx context.Context, cl *quorumlock.Client) []uint64 {
	t.Helper()
	var ids []uint64
	var after uint64
	for {
		list, more, err := cl.Sessions(ctx, after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			ids = append(ids, s.ID)
			after = s.ID
		}
		if !more {
			return ids
		}
	}
}

// TestReviewNTimedOutOpensLeaveNoSessions: one client opens 6,000 sessions
// at once. Under that load some open attempts outlast the client's
// attempt limit (twice the election timeout) and are sent again; the
// session each first attempt opened is one nobody learns the ID of. The
// leader must expire those at once: the cluster soon holds exactly the
// sessions the callers got. Before, it held about 9,700 for a TTL (a
// minute here), each taking a place under MaxSessions.
func TestReviewNTimedOutOpensLeaveNoSessions(t *testing.T) {
	const sessions = 6000 / reviewNScale
	// The client's attempts time out after 200 ms (WithElectionTimeout
	// 100 ms in dial).
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(10 * time.Second)
	term := c.Node(lead).Status().Term
	cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithSessionTTL(time.Minute))
	ctx := testCtx(t, 50*time.Second)
	var wg sync.WaitGroup
	var opened atomic.Int64
	for range sessions {
		wg.Go(func() {
			if _, err := cl.NewSession(ctx); err != nil {
				t.Errorf("NewSession: %v", err)
				return
			}
			opened.Add(1)
		})
	}
	wg.Wait()
	var live int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if live = len(listedSessions(t, ctx, cl)); live == int(opened.Load()) {
			return
		}
	}
	if after := c.Node(lead).Status().Term; after != term {
		// Opens that the old leader logged and whose answers were lost
		// were known to no one and stayed for their TTL, before open
		// IDs (review S), with which the retries claim them. The skip
		// stays for what else a leader change under this load may do.
		t.Skipf("the leader changed under the load (term %d to %d): %d sessions opened, the cluster holds %d", term, after, opened.Load(), live)
	}
	t.Fatalf("%d sessions opened, the cluster holds %d 5 s later", opened.Load(), live)
}

// TestReviewNDuplicateCallsOnOneStreamBounded: a client that sends 20,000
// copies of one waiting acquire (same session and seq) on one propose
// stream gets CODE_UNAVAILABLE (retry; CODE_LIMIT before review Q) for
// all but service.MaxCopiesInFlight of them:
// the leader keeps a bounded number of goroutines and log entries for
// them. Before, it ran 20,000 goroutines (50,000 copies: +50,000
// goroutines, +89 MB of heap) and logged 20,000 entries.
func TestReviewNDuplicateCallsOnOneStreamBounded(t *testing.T) {
	const copies = 20000 / reviewNScale
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(10 * time.Second)
	lc := dialLeader(t, c.Node(lead))
	ctx := testCtx(t, 15*time.Second)
	open := func() uint64 {
		r, err := lc.Propose(ctx, &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: 60_000})
		if err != nil || r.GetCode() != lockpb.Code_CODE_OK {
			t.Fatalf("open: %v, %v", r, err)
		}
		return r.GetSession()
	}
	a, b := open(), open()
	if r, err := lc.Propose(ctx, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a, Seq: 1, Done: 1, Name: "x"}); err != nil || r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("acquire: %v, %v", r, err)
	}
	commit0 := c.Node(lead).Status().Commit
	g0 := reviewNGoroutines()
	st, err := lc.ProposeStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < copies; i += 500 {
		var calls []*lockpb.ProposeCall
		for j := i; j < i+500; j++ {
			calls = append(calls, &lockpb.ProposeCall{Id: uint64(j + 1), Request: &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: b, Seq: 1, Done: 1, Name: "x"}})
		}
		if err := st.Send(&lockpb.ProposeCalls{Calls: calls}); err != nil {
			t.Fatal(err)
		}
	}
	limited := 0
	for limited < copies-service.MaxCopiesInFlight {
		in, err := st.Recv()
		if err != nil {
			t.Fatalf("after %d CODE_UNAVAILABLE answers: %v", limited, err)
		}
		for _, r := range in.GetReplies() {
			switch code := r.GetResponse().GetCode(); code {
			case lockpb.Code_CODE_UNAVAILABLE:
				limited++
			case lockpb.Code_CODE_NOT_LEADER:
				// The waiting copies are answered so at a leader
				// change (-race on a loaded machine).
				t.Skipf("the leader changed under the load (%v)", code)
			default:
				t.Fatalf("copy %d answered %v while the lock is held", r.GetId(), r.GetResponse())
			}
		}
	}
	if g := reviewNGoroutines(); g > g0+service.MaxCopiesInFlight+50 {
		t.Errorf("goroutines: %d with %d copies of one waiting acquire sent, %d before", g, copies, g0)
	}
	if d := c.Node(lead).Status().Commit - commit0; d > service.MaxCopiesInFlight+50 {
		t.Errorf("%d entries logged for %d copies of one request", d, copies)
	}
}
