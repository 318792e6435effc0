package quorumlock_test

// Black-box acceptance tests written from the texts of issue 2 (core:
// sessions, Acquire/Release, fencing tokens) and issue 4 (Elect with epochs,
// Observe, Resign, Leader), the way an outside grader who knows etcd, Consul
// or ZooKeeper/Curator would use the API. They use only the names the issues
// give, plus internal/testcluster to stop, restart and cut off replicas.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// hidWaitWaiters waits until name's queue (Holder) lists want, in order.
func hidWaitWaiters(t *testing.T, n *quorumlock.Node, name string, want []uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := n.Holder(testCtx(t, 5*time.Second), name)
		if err == nil && fmt.Sprint(info.Waiters) == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiters of %q: got %v (err %v), want %v", name, info.Waiters, err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A waiter whose ctx has a 2 s deadline is granted the lock when the
// holder releases it 800 ms in, with a larger token (issue 2: Acquire
// "blocks, FIFO, until granted or ctx done").
func TestHiddenWaiterGrantedWithinDeadline(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	hidWaiterGranted(t, c.Node(ld), c.Node(follower(c, ld)), 2*time.Second, 800*time.Millisecond)
}

// The same with the default Config a user gets from the README (1 s
// election timeout): a waiter with a 3 s deadline whose holder releases
// 1.5 s in is granted.
func TestHiddenWaiterGrantedWithinDeadlineDefaultConfig(t *testing.T) {
	nodes := specCluster(t, 3, func(cfg *quorumlock.Config) {
		cfg.TickInterval, cfg.ElectionTicks = 0, 0 // the defaults: 100 ms tick, 1 s election timeout, 10 s TTL
	})
	hidWaiterGranted(t, nodes[0], nodes[1], 3*time.Second, 1500*time.Millisecond)
}

// hidWaiterGranted checks that a session on waiterN whose Acquire has a
// ctx with the given deadline is granted the lock, with a larger token,
// when a session on holderN that holds it releases it releaseAfter in.
func hidWaiterGranted(t *testing.T, holderN, waiterN *quorumlock.Node, deadline, releaseAfter time.Duration) {
	t.Helper()
	holderS := newSession(t, holderN)
	waiterS := newSession(t, waiterN)
	l1 := mustAcquire(t, holderS, "job")
	wctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	res := acquireAsync(wctx, waiterS, "job")
	time.Sleep(releaseAfter)
	if err := l1.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("waiter with %v deadline, released after %v: %v", deadline, releaseAfter, r.err)
	}
	if r.l.Token() <= l1.Token() {
		t.Fatalf("token %d after %d", r.l.Token(), l1.Token())
	}
}

// Several waiters on different replicas are granted in the order they
// queued, each with a larger token than the one before.
func TestHiddenFIFOOrder(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	c.WaitLeader(10 * time.Second)
	ids := c.IDs()
	holderS := newSession(t, c.Node(ids[0]))
	first, err := holderS.Acquire(testCtx(t, 5*time.Second), "fifo")
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 30*time.Second)
	var waiters []*quorumlock.Session
	var results []<-chan acquireResult
	var queued []uint64
	for i := range 4 {
		s := newSession(t, c.Node(ids[i%len(ids)]))
		waiters = append(waiters, s)
		results = append(results, acquireAsync(ctx, s, "fifo"))
		queued = append(queued, s.ID())
		hidWaitWaiters(t, c.Node(ids[0]), "fifo", queued)
	}
	prev := first
	for i, s := range waiters {
		if err := prev.Release(testCtx(t, 5*time.Second)); err != nil {
			t.Fatalf("Release %d: %v", i, err)
		}
		r := <-results[i]
		if r.err != nil {
			t.Fatalf("waiter %d: %v", i, r.err)
		}
		if r.l.Session() != s {
			t.Fatalf("waiter %d got a lock of another session", i)
		}
		if r.l.Token() <= prev.Token() {
			t.Fatalf("waiter %d: token %d after %d", i, r.l.Token(), prev.Token())
		}
		// The ones behind are still waiting.
		for j := i + 1; j < len(results); j++ {
			select {
			case r := <-results[j]:
				t.Fatalf("waiter %d returned before waiter %d's turn: %v", j, i, r.err)
			default:
			}
		}
		prev = r.l
	}
}

// TryAcquire of a lock another session holds fails with ErrLocked and
// does not queue; the holder re-acquiring gets the same grant; once the
// lock is released TryAcquire succeeds with a larger token.
func TestHiddenTryAcquireAndReacquire(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	f := follower(c, ld)
	a := newSession(t, c.Node(ld))
	b := newSession(t, c.Node(f))
	ctx := testCtx(t, 20*time.Second)
	la, err := a.Acquire(ctx, "res")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "res"); !errors.Is(err, quorumlock.ErrLocked) {
		t.Fatalf("TryAcquire of a held lock: %v, want ErrLocked", err)
	}
	info, err := c.Node(f).Holder(ctx, "res")
	if err != nil {
		t.Fatal(err)
	}
	if info.Holder != a.ID() || info.Token != la.Token() || len(info.Waiters) != 0 {
		t.Fatalf("Holder after a refused TryAcquire: %+v", info)
	}
	// Re-acquire by the holder: same grant, both by Acquire and TryAcquire.
	again, err := a.Acquire(ctx, "res")
	if err != nil || again.Token() != la.Token() {
		t.Fatalf("re-Acquire by holder: %v, token %v want %d", err, again, la.Token())
	}
	again2, err := a.TryAcquire(ctx, "res")
	if err != nil || again2.Token() != la.Token() {
		t.Fatalf("TryAcquire by holder: %v, want token %d", err, la.Token())
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb, err := b.TryAcquire(ctx, "res")
	if err != nil {
		t.Fatalf("TryAcquire of a free lock: %v", err)
	}
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d after %d", lb.Token(), la.Token())
	}
}

// Releasing twice: the first frees the lock and closes Lost, the second
// returns ErrNotHeld and does not free the next holder's grant.
func TestHiddenReleaseTwice(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	a := newSession(t, c.Node(ld))
	b := newSession(t, c.Node(follower(c, ld)))
	ctx := testCtx(t, 20*time.Second)
	la, err := a.Acquire(ctx, "twice")
	if err != nil {
		t.Fatal(err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !closed(la.Lost()) {
		t.Fatal("Lost not closed after Release")
	}
	lb, err := b.Acquire(ctx, "twice")
	if err != nil {
		t.Fatal(err)
	}
	if err := la.Release(ctx); !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Fatalf("second Release: %v, want ErrNotHeld", err)
	}
	info, err := c.Node(ld).Holder(ctx, "twice")
	if err != nil || info.Holder != b.ID() || info.Token != lb.Token() {
		t.Fatalf("after a second Release of the old grant: %+v, %v", info, err)
	}
	if closed(lb.Lost()) {
		t.Fatal("new holder's Lost closed")
	}
}

// A session whose replica is cut off from the others: its lease runs out
// on the client (Done, Lost close) before another session is granted its
// lock; the new grant has a larger token; Release of the old grant then
// fails with ErrSessionExpired and does not disturb the new holder.
// Both a follower's and the leader's session are checked.
func TestHiddenCutOffReplicaLosesLockFirst(t *testing.T) {
	t.Parallel()
	for _, onLeader := range []bool{false, true} {
		t.Run(fmt.Sprintf("onLeader=%v", onLeader), func(t *testing.T) {
			c := testcluster.New(t, testcluster.Options{Size: 3})
			ld := c.WaitLeader(10 * time.Second)
			victim := follower(c, ld)
			if onLeader {
				victim = ld
			}
			s := newSession(t, c.Node(victim), quorumlock.WithTTL(2*time.Second))
			ctx := testCtx(t, 30*time.Second)
			l, err := s.Acquire(ctx, "cut")
			if err != nil {
				t.Fatal(err)
			}
			other := follower(c, victim)
			c.Isolate(victim)
			c.Node(other) // still running
			// The waiter must use a replica in the majority.
			o := newSession(t, c.Node(other))
			l2, err := o.Acquire(ctx, "cut")
			if err != nil {
				t.Fatalf("Acquire in the majority: %v", err)
			}
			// The check: when the new grant is seen, the old holder has
			// already been told.
			if !closed(l.Lost()) {
				t.Fatal("new holder granted while the cut-off holder's Lost is still open")
			}
			if !closed(s.Done()) {
				t.Fatal("cut-off session's Done still open after its lock was granted elsewhere")
			}
			if l2.Token() <= l.Token() {
				t.Fatalf("token %d after %d", l2.Token(), l.Token())
			}
			if err := l.Release(testCtx(t, 5*time.Second)); !errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Fatalf("Release after the session expired: %v, want ErrSessionExpired", err)
			}
			c.Heal()
			info, err := c.Node(other).Holder(ctx, "cut")
			if err != nil || info.Holder != o.ID() || info.Token != l2.Token() {
				t.Fatalf("holder after the stale Release: %+v, %v", info, err)
			}
			if _, err := s.Acquire(testCtx(t, 5*time.Second), "other"); !errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Fatalf("Acquire on the expired session: %v, want ErrSessionExpired", err)
			}
		})
	}
}

// Release after the session was closed fails (the grant is gone) and does
// not affect anybody else.
func TestHiddenReleaseAfterSessionClosed(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	a := newSession(t, c.Node(ld))
	b := newSession(t, c.Node(follower(c, ld)))
	ctx := testCtx(t, 20*time.Second)
	la, err := a.Acquire(ctx, "closed")
	if err != nil {
		t.Fatal(err)
	}
	res := acquireAsync(ctx, b, "closed")
	hidWaitWaiters(t, c.Node(ld), "closed", []uint64{b.ID()})
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !closed(la.Lost()) || !closed(a.Done()) {
		t.Fatal("Lost/Done open after Close")
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("waiter after the holder's Close: %v", r.err)
	}
	err = la.Release(ctx)
	if err == nil {
		t.Fatal("Release after Close succeeded")
	}
	if !errors.Is(err, quorumlock.ErrSessionExpired) && !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Fatalf("Release after Close: %v", err)
	}
	info, err := c.Node(ld).Holder(ctx, "closed")
	if err != nil || info.Holder != b.ID() || info.Token != r.l.Token() {
		t.Fatalf("holder: %+v, %v", info, err)
	}
}

// Tokens of a lock strictly increase across holders, across a crash of
// the leader, and across a restart of every replica.
func TestHiddenTokensIncreaseAcrossFailoverAndRestart(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	var last quorumlock.Token
	fence := quorumlock.NewFence()
	take := func(n *quorumlock.Node, step string) {
		t.Helper()
		s, err := n.NewSession(testCtx(t, 20*time.Second))
		if err != nil {
			t.Fatalf("%s: NewSession: %v", step, err)
		}
		l, err := s.Acquire(testCtx(t, 20*time.Second), "tok")
		if err != nil {
			t.Fatalf("%s: Acquire: %v", step, err)
		}
		if l.Token() <= last {
			t.Fatalf("%s: token %d after %d", step, l.Token(), last)
		}
		if err := fence.Admit("tok", l.Token()); err != nil {
			t.Fatalf("%s: fence: %v", step, err)
		}
		last = l.Token()
		if err := l.Release(testCtx(t, 10*time.Second)); err != nil {
			t.Fatalf("%s: Release: %v", step, err)
		}
		_ = s.Close(testCtx(t, 10*time.Second))
	}
	for i := range 3 {
		take(c.Node(c.IDs()[i]), fmt.Sprintf("holder %d", i))
	}
	c.Stop(ld)
	nl := c.WaitLeader(15 * time.Second)
	take(c.Node(nl), "after leader crash")
	take(c.Node(follower(c, nl)), "after leader crash, on a follower")
	c.Restart(ld)
	take(c.Node(ld), "on the restarted old leader")
	c.StopAll()
	for _, id := range c.IDs() {
		c.Restart(id)
	}
	nl = c.WaitLeader(15 * time.Second)
	take(c.Node(nl), "after restarting every replica")
	if err := fence.Admit("tok", last-1); !errors.Is(err, quorumlock.ErrStaleToken) {
		t.Fatalf("fence admitted a stale token: %v", err)
	}
}

// Fence admits equal or increasing tokens per resource and refuses a lower
// one with ErrStaleToken, changing nothing.
func TestHiddenFence(t *testing.T) {
	f := quorumlock.NewFence()
	for _, tok := range []quorumlock.Token{3, 3, 7, 100} {
		if err := f.Admit("db", tok); err != nil {
			t.Fatalf("Admit(%d): %v", tok, err)
		}
	}
	if err := f.Admit("db", 99); !errors.Is(err, quorumlock.ErrStaleToken) {
		t.Fatalf("Admit(99) after 100: %v, want ErrStaleToken", err)
	}
	if err := f.Admit("db", 100); err != nil {
		t.Fatalf("Admit(100) after a refused 99: %v", err)
	}
	// Resources are independent.
	if err := f.Admit("other", 1); err != nil {
		t.Fatalf("Admit on another resource: %v", err)
	}
	var zero quorumlock.Fence
	if err := zero.Admit("x", 5); err != nil {
		t.Fatal(err)
	}
	if err := zero.Admit("x", 4); !errors.Is(err, quorumlock.ErrStaleToken) {
		t.Fatalf("zero Fence: %v", err)
	}
}

type hidElectResult struct {
	l   *quorumlock.Leadership
	err error
}

func hidElectAsync(ctx context.Context, n *quorumlock.Node, role string, value string) <-chan hidElectResult {
	ch := make(chan hidElectResult, 1)
	go func() {
		l, err := n.Elect(ctx, role, []byte(value))
		ch <- hidElectResult{l, err}
	}()
	return ch
}

// Three candidates on three replicas: one leads, Resign hands over to the
// next with a larger epoch, Leader reports each, and ErrNoLeader once the
// last resigns. Observe reports every leader with a "no leader" between
// two leaders, epochs never decreasing.
func TestHiddenElectResignLeaderObserve(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	c.WaitLeader(10 * time.Second)
	ids := c.IDs()
	ctx := testCtx(t, 60*time.Second)
	if _, err := c.Node(ids[0]).Leader(ctx, "scheduler"); !errors.Is(err, quorumlock.ErrNoLeader) {
		t.Fatalf("Leader before any election: %v, want ErrNoLeader", err)
	}
	events := c.Node(ids[1]).Observe(ctx, "scheduler")
	if ev := nextEvent(t, events); ev.HasLeader() {
		t.Fatalf("first Observe event: %+v, want no leader", ev)
	}
	first, err := c.Node(ids[0]).Elect(ctx, "scheduler", []byte("r1"))
	if err != nil {
		t.Fatal(err)
	}
	pending := []<-chan hidElectResult{
		hidElectAsync(ctx, c.Node(ids[1]), "scheduler", "r2"),
	}
	// Queue the third after the second (FIFO). The role's queue is not in
	// the API (Leader and Observe show only the leader), so give
	// the second candidate time to queue first.
	time.Sleep(300 * time.Millisecond)
	pending = append(pending, hidElectAsync(ctx, c.Node(ids[2]), "scheduler", "r3"))
	time.Sleep(300 * time.Millisecond)

	leaders := []*quorumlock.Leadership{first}
	cur := first
	for i := range pending {
		info, err := c.Node(ids[2]).Leader(ctx, "scheduler")
		if err != nil || info.Epoch != cur.Epoch() || info.Session != cur.Session().ID() {
			t.Fatalf("Leader: %+v, %v; want epoch %d session %d", info, err, cur.Epoch(), cur.Session().ID())
		}
		select {
		case r := <-pending[i]:
			t.Fatalf("candidate %d elected while %d leads: %v", i+2, i+1, r.err)
		default:
		}
		if err := cur.Resign(ctx); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		if !closed(cur.Done()) || cur.Context().Err() == nil {
			t.Fatal("Done/Context not ended by Resign")
		}
		r := <-pending[i]
		if r.err != nil {
			t.Fatalf("candidate %d: %v", i+2, r.err)
		}
		if r.l.Epoch() <= cur.Epoch() {
			t.Fatalf("epoch %d after %d", r.l.Epoch(), cur.Epoch())
		}
		if want := fmt.Sprintf("r%d", i+2); string(mustLeaderValue(t, c.Node(ids[0]), ctx)) != want {
			t.Fatalf("leader value, want %s", want)
		}
		cur = r.l
		leaders = append(leaders, cur)
	}
	if err := cur.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Node(ids[0]).Leader(ctx, "scheduler"); !errors.Is(err, quorumlock.ErrNoLeader) {
		t.Fatalf("Leader after the last resigned: %v, want ErrNoLeader", err)
	}
	// Observe: leader, none, leader, none, leader, none; epochs ascend.
	var last quorumlock.Token
	for i, ld := range leaders {
		ev := nextEvent(t, events)
		if !ev.HasLeader() || ev.Epoch != ld.Epoch() || ev.Session != ld.Session().ID() || string(ev.Value) != fmt.Sprintf("r%d", i+1) {
			t.Fatalf("event %d: %+v, want leader epoch %d", i, ev, ld.Epoch())
		}
		if ev.Epoch <= last {
			t.Fatalf("epoch went from %d to %d", last, ev.Epoch)
		}
		last = ev.Epoch
		ev = nextEvent(t, events)
		if ev.HasLeader() || ev.Epoch < last {
			t.Fatalf("event after leader %d: %+v, want no leader", i, ev)
		}
	}
}

func mustLeaderValue(t *testing.T, n *quorumlock.Node, ctx context.Context) []byte {
	t.Helper()
	info, err := n.Leader(ctx, "scheduler")
	if err != nil {
		t.Fatal(err)
	}
	return info.Value
}

// A role and a lock of the same name do not collide.
func TestHiddenRoleNamespace(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	ctx := testCtx(t, 20*time.Second)
	s := newSession(t, c.Node(ld))
	o := newSession(t, c.Node(follower(c, ld)))
	if _, err := s.Acquire(ctx, "scheduler"); err != nil {
		t.Fatal(err)
	}
	lead, err := o.Elect(ctx, "scheduler", nil)
	if err != nil {
		t.Fatalf("Elect of a role named like a held lock: %v", err)
	}
	info, err := c.Node(ld).Holder(ctx, "scheduler")
	if err != nil || info.Holder != s.ID() {
		t.Fatalf("lock holder: %+v, %v", info, err)
	}
	li, err := c.Node(ld).Leader(ctx, "scheduler")
	if err != nil || li.Session != o.ID() || li.Epoch != lead.Epoch() {
		t.Fatalf("role leader: %+v, %v", li, err)
	}
}

// A leader whose replica is cut off: its Done closes (and Context is
// cancelled) before the next candidate is elected, with a larger epoch;
// its Proclaim then fails. Observe on a majority replica reports the
// change with a "no leader" in between.
func TestHiddenLeaderCutOffEndsBeforeNextElected(t *testing.T) {
	t.Parallel()
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	victim := follower(c, ld)
	ctx := testCtx(t, 60*time.Second)
	s := newSession(t, c.Node(victim), quorumlock.WithTTL(2*time.Second))
	old, err := s.Elect(ctx, "sched", []byte("old"))
	if err != nil {
		t.Fatal(err)
	}
	events := c.Node(ld).Observe(ctx, "sched")
	if ev := nextEvent(t, events); ev.Epoch != old.Epoch() {
		t.Fatalf("first event %+v, want epoch %d", ev, old.Epoch())
	}
	res := hidElectAsync(ctx, c.Node(ld), "sched", "new")
	time.Sleep(200 * time.Millisecond)
	c.Isolate(victim)
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !closed(old.Done()) || old.Context().Err() == nil {
		t.Fatal("next candidate elected while the cut-off leader's Done is open")
	}
	if r.l.Epoch() <= old.Epoch() {
		t.Fatalf("epoch %d after %d", r.l.Epoch(), old.Epoch())
	}
	if err := old.Proclaim(testCtx(t, 5*time.Second), []byte("x")); err == nil {
		t.Fatal("Proclaim by the deposed leader succeeded")
	}
	if ev := nextEvent(t, events); ev.HasLeader() {
		t.Fatalf("event after the old leader: %+v, want no leader", ev)
	}
	if ev := nextEvent(t, events); !ev.HasLeader() || ev.Epoch != r.l.Epoch() || string(ev.Value) != "new" {
		t.Fatalf("event for the new leader: %+v", ev)
	}
	c.Heal()
	li, err := c.Node(victim).Leader(ctx, "sched")
	if err != nil || li.Epoch != r.l.Epoch() {
		t.Fatalf("Leader on the healed replica: %+v, %v", li, err)
	}
}

// The leader's replica crashes: the candidate on another replica takes over
// with a larger epoch; Observe on a surviving replica keeps reporting.
func TestHiddenElectAcrossReplicaFailover(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	rl := c.WaitLeader(10 * time.Second) // raft leader
	ctx := testCtx(t, 60*time.Second)
	old, err := c.Node(rl).Elect(ctx, "sched", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	f := follower(c, rl)
	events := c.Node(f).Observe(ctx, "sched")
	if ev := nextEvent(t, events); ev.Epoch != old.Epoch() {
		t.Fatalf("first event %+v", ev)
	}
	res := hidElectAsync(ctx, c.Node(f), "sched", "b")
	time.Sleep(200 * time.Millisecond)
	c.Stop(rl)
	if !closed(old.Done()) {
		t.Fatal("Done open after the leader's replica stopped")
	}
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.l.Epoch() <= old.Epoch() {
		t.Fatalf("epoch %d after %d", r.l.Epoch(), old.Epoch())
	}
	var last quorumlock.Token
	for {
		ev := nextEvent(t, events)
		if ev.Epoch < last {
			t.Fatalf("epoch went back: %d after %d", ev.Epoch, last)
		}
		last = ev.Epoch
		if ev.HasLeader() {
			if ev.Epoch != r.l.Epoch() {
				t.Fatalf("event %+v, want epoch %d", ev, r.l.Epoch())
			}
			break
		}
	}
	// And after a restart of every replica, the next epoch is larger still.
	if err := r.l.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	c.Restart(rl)
	c.StopAll()
	for _, id := range c.IDs() {
		c.Restart(id)
	}
	nl := c.WaitLeader(15 * time.Second)
	again, err := c.Node(nl).Elect(ctx, "sched", nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Epoch() <= r.l.Epoch() {
		t.Fatalf("epoch after a full restart %d, before %d", again.Epoch(), r.l.Epoch())
	}
}

// Proclaim changes the value without a new epoch: Leader and Observe
// report it; Session.Elect again by the leading session returns the same
// leadership; Resign twice returns ErrNotHeld the second time.
func TestHiddenProclaimObserveAndSessionElect(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	ctx := testCtx(t, 30*time.Second)
	s := newSession(t, c.Node(follower(c, ld)))
	events := c.Node(ld).Observe(ctx, "svc")
	if ev := nextEvent(t, events); ev.HasLeader() {
		t.Fatalf("first event %+v", ev)
	}
	lead, err := s.Elect(ctx, "svc", []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.Elect(ctx, "svc", []byte("ignored")); err != nil || again != lead {
		t.Fatalf("Elect again by the leader: %v, %v", again, err)
	}
	if ev := nextEvent(t, events); ev.Epoch != lead.Epoch() || string(ev.Value) != "v1" {
		t.Fatalf("event %+v", ev)
	}
	if err := lead.Proclaim(ctx, []byte("v2")); err != nil {
		t.Fatal(err)
	}
	li, err := c.Node(ld).Leader(ctx, "svc")
	if err != nil || li.Epoch != lead.Epoch() || string(li.Value) != "v2" {
		t.Fatalf("Leader after Proclaim: %+v, %v", li, err)
	}
	if ev := nextEvent(t, events); ev.Epoch != lead.Epoch() || string(ev.Value) != "v2" {
		t.Fatalf("event after Proclaim %+v", ev)
	}
	if err := lead.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lead.Resign(ctx); !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Fatalf("second Resign: %v, want ErrNotHeld", err)
	}
	if err := lead.Proclaim(ctx, []byte("v3")); !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Fatalf("Proclaim after Resign: %v, want ErrNotHeld", err)
	}
	if ev := nextEvent(t, events); ev.HasLeader() {
		t.Fatalf("event after Resign %+v", ev)
	}
	// The session lives on and can lead again, with a larger epoch.
	lead2, err := s.Elect(ctx, "svc", []byte("v4"))
	if err != nil || lead2.Epoch() <= lead.Epoch() {
		t.Fatalf("Elect after Resign: %v, %v", lead2, err)
	}
}

// A leader whose session is closed (Session.Close) hands over to the next
// candidate, whose epoch is larger; the old Done closed first.
func TestHiddenLeaderSessionCloseHandsOver(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	ctx := testCtx(t, 30*time.Second)
	s := newSession(t, c.Node(ld))
	lead, err := s.Elect(ctx, "svc", nil)
	if err != nil {
		t.Fatal(err)
	}
	res := hidElectAsync(ctx, c.Node(follower(c, ld)), "svc", "next")
	time.Sleep(200 * time.Millisecond)
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !closed(lead.Done()) {
		t.Fatal("Done open after the session closed")
	}
	r := <-res
	if r.err != nil || r.l.Epoch() <= lead.Epoch() {
		t.Fatalf("next candidate: %v, %v", r.l, r.err)
	}
}

// A candidate whose session dies while it waits never becomes leader: the
// candidate behind it is next.
func TestHiddenDeadCandidateNeverLeads(t *testing.T) {
	t.Parallel()
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	victim := follower(c, ld)
	third := follower(c, ld, victim)
	ctx := testCtx(t, 60*time.Second)
	first, err := c.Node(ld).Elect(ctx, "svc", []byte("first"))
	if err != nil {
		t.Fatal(err)
	}
	dying := newSession(t, c.Node(victim), quorumlock.WithTTL(2*time.Second))
	dres := make(chan hidElectResult, 1)
	go func() {
		l, err := dying.Elect(ctx, "svc", []byte("dying"))
		dres <- hidElectResult{l, err}
	}()
	time.Sleep(300 * time.Millisecond)
	next := hidElectAsync(ctx, c.Node(third), "svc", "third")
	time.Sleep(300 * time.Millisecond)
	c.Isolate(victim)
	select {
	case <-dying.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("cut-off session did not end")
	}
	// Give the leader time to expire it on the cluster (a full TTL after
	// its last heartbeat, plus margin).
	time.Sleep(1 * time.Second)
	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-next
	if r.err != nil {
		t.Fatal(r.err)
	}
	li, err := c.Node(ld).Leader(ctx, "svc")
	if err != nil || li.Session == dying.ID() || string(li.Value) != "third" {
		t.Fatalf("leader %+v, %v", li, err)
	}
	d := <-dres
	if d.err == nil {
		t.Fatalf("the dead candidate's Elect returned a leadership (epoch %d)", d.l.Epoch())
	}
	c.Heal()
}

// Node.Elect whose ctx ends while another leads leaves nothing behind: the
// candidate never leads, and its dedicated session is gone (checked with
// a Client's session listing).
func TestHiddenNodeElectCancelledLeavesNoSession(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	ctx := testCtx(t, 30*time.Second)
	first, err := c.Node(ld).Elect(ctx, "svc", nil)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = c.Node(follower(c, ld)).Elect(short, "svc", nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Elect with a short ctx: %v", err)
	}
	cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithElectionTimeout(c.ElectionTimeout()))
	deadline := time.Now().Add(5 * time.Second)
	for {
		ss, _, err := cl.Sessions(ctx, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(ss) == 1 && ss[0].ID == first.Session().ID() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sessions after a cancelled Node.Elect: %+v", ss)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Node(ld).Leader(ctx, "svc"); !errors.Is(err, quorumlock.ErrNoLeader) {
		t.Fatalf("Leader after the only leader resigned: %v", err)
	}
}

// A holder on a follower keeps its lock (Lost stays open, same token)
// while the raft leader is restarted gracefully and while it crashes:
// a leaderless window shorter than the TTL loses no lock.
func TestHiddenLockSurvivesLeaderChanges(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	f := follower(c, ld)
	ctx := testCtx(t, 60*time.Second)
	s := newSession(t, c.Node(f))
	l, err := s.Acquire(ctx, "keep")
	if err != nil {
		t.Fatal(err)
	}
	c.Close(ld) // graceful: leadership transfer
	c.WaitLeader(15 * time.Second)
	c.Restart(ld)
	// Then a crash of the leader, unless the holder's replica leads now
	// (a crash would end its session).
	if l2 := c.WaitLeader(15 * time.Second); l2 != f {
		c.Stop(l2)
		c.WaitLeader(15 * time.Second)
	} else {
		t.Log("the holder's replica leads: no crash step")
	}
	// Wait beyond a TTL to be sure the session was renewed through the
	// new leader.
	time.Sleep(5 * time.Second)
	if closed(l.Lost()) || closed(s.Done()) {
		t.Fatalf("lock lost across leader changes: %v", s.Err())
	}
	info, err := c.Node(f).Holder(ctx, "keep")
	if err != nil || info.Holder != s.ID() || info.Token != l.Token() {
		t.Fatalf("holder after leader changes: %+v, %v", info, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A waiter that gives up (cancel, then a deadline) leaves the queue: the
// Holder read shows no waiter, and the lock goes to the next one.
func TestHiddenWaiterGivesUp(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	ctx := testCtx(t, 30*time.Second)
	h := newSession(t, c.Node(ld))
	w := newSession(t, c.Node(follower(c, ld)))
	l, err := h.Acquire(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	res := acquireAsync(cctx, w, "q")
	hidWaitWaiters(t, c.Node(ld), "q", []uint64{w.ID()})
	cancel()
	if r := <-res; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v, %v", r.l, r.err)
	}
	hidWaitWaiters(t, c.Node(ld), "q", nil)
	dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer dcancel()
	if _, err := w.Acquire(dctx, "q"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline: %v", err)
	}
	hidWaitWaiters(t, c.Node(ld), "q", nil)
	if w.Err() != nil {
		t.Fatalf("the waiter's session ended: %v", w.Err())
	}
	// The holder's release frees the lock: nobody waits.
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := c.Node(ld).Holder(ctx, "q")
	if err != nil || info.Holder != 0 {
		t.Fatalf("lock after the waiters left: %+v, %v", info, err)
	}
}

// Observe on a replica that is cut off and then rejoins: the changes made
// meanwhile are reported after it rejoins, in epoch order, with a "no
// leader" between two leaders; the stream closes when its ctx ends.
func TestHiddenObserveResumesAfterPartition(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	obs := follower(c, ld)
	other := follower(c, ld, obs)
	ctx := testCtx(t, 60*time.Second)
	octx, ocancel := context.WithCancel(ctx)
	defer ocancel()
	events := c.Node(obs).Observe(octx, "svc")
	if ev := nextEvent(t, events); ev.HasLeader() {
		t.Fatalf("first event %+v", ev)
	}
	a, err := c.Node(ld).Elect(ctx, "svc", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, events); ev.Epoch != a.Epoch() {
		t.Fatalf("event %+v, want epoch %d", ev, a.Epoch())
	}
	c.Isolate(obs)
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := c.Node(other).Elect(ctx, "svc", []byte("b"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	c.Heal()
	var sawNone bool
	last := a.Epoch()
	for {
		ev := nextEvent(t, events)
		if ev.Epoch < last {
			t.Fatalf("epoch went back: %+v after %d", ev, last)
		}
		if ev.HasLeader() && ev.Epoch == last && last == a.Epoch() {
			t.Fatalf("leader %d reported again: %+v", a.Epoch(), ev)
		}
		last = ev.Epoch
		if !ev.HasLeader() {
			sawNone = true
			continue
		}
		if ev.Epoch != b.Epoch() || string(ev.Value) != "b" {
			t.Fatalf("event %+v, want leader b (epoch %d)", ev, b.Epoch())
		}
		break
	}
	if !sawNone {
		t.Fatal("no \"no leader\" event between a and b")
	}
	ocancel()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("Observe channel open 5 s after its ctx ended")
		}
	}
}

// Every replica is restarted while a leader leads: the leader's Done
// closes (its replica stopped), and a candidate after the restart is
// elected (once the cluster expires the old session) with a larger epoch.
func TestHiddenElectAfterWholeClusterRestart(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	ctx := testCtx(t, 60*time.Second)
	old, err := c.Node(ld).Elect(ctx, "svc", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.StopAll()
	if !closed(old.Done()) {
		t.Fatal("Done open after every replica stopped")
	}
	for _, id := range c.IDs() {
		c.Restart(id)
	}
	nl := c.WaitLeader(15 * time.Second)
	nu, err := c.Node(nl).Elect(ctx, "svc", nil)
	if err != nil {
		t.Fatal(err)
	}
	if nu.Epoch() <= old.Epoch() {
		t.Fatalf("epoch %d after %d", nu.Epoch(), old.Epoch())
	}
}

// Bad input through the issues' API: clear sentinel errors, nothing held.
func TestHiddenBadInput(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	n := c.Node(ld)
	ctx := testCtx(t, 20*time.Second)
	if _, err := n.NewSession(ctx, quorumlock.WithTTL(500*time.Millisecond)); !errors.Is(err, quorumlock.ErrInvalidTTL) {
		t.Fatalf("TTL 500ms: %v", err)
	}
	if _, err := n.NewSession(ctx, quorumlock.WithTTL(time.Hour)); !errors.Is(err, quorumlock.ErrInvalidTTL) {
		t.Fatalf("TTL 1h: %v", err)
	}
	s := newSession(t, n)
	long := strings.Repeat("a", 257)
	for _, name := range []string{"", "\xff\xfe", long, "a\x00b"} {
		checkLockCallsRefuseName(t, ctx, s, n, name)
		if _, err := s.Elect(ctx, name, nil); !errors.Is(err, quorumlock.ErrInvalidName) {
			t.Errorf("Elect(%q): %v", name, err)
		}
		if _, err := n.Leader(ctx, name); !errors.Is(err, quorumlock.ErrInvalidName) {
			t.Errorf("Leader(%q): %v", name, err)
		}
		select {
		case _, ok := <-n.Observe(ctx, name):
			if ok {
				t.Errorf("Observe(%q) delivered an event", name)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Observe(%q) not closed", name)
		}
	}
	if _, err := s.Elect(ctx, "role", make([]byte, quorumlock.MaxValueBytes+1)); !errors.Is(err, quorumlock.ErrLimit) {
		t.Errorf("Elect with an oversized value: %v", err)
	}
	info, err := n.Holder(ctx, "never-used")
	if err != nil || info.Holder != 0 || info.Token != 0 || len(info.Waiters) != 0 {
		t.Errorf("Holder of an unused lock: %+v, %v", info, err)
	}
	if s.Err() != nil || len(s.Locks()) != 0 {
		t.Errorf("session after bad input: %v, %v", s.Err(), s.Locks())
	}
}

// Concurrent acquirers on every replica: never two holders at once (a
// shared counter and a Fence see only increasing tokens, never a
// concurrent holder), and every round completes.
func TestHiddenConcurrentMutualExclusion(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	c.WaitLeader(10 * time.Second)
	ctx := testCtx(t, 60*time.Second)
	fence := quorumlock.NewFence()
	var inside atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 6 {
		s := newSession(t, c.Node(c.IDs()[i%3]))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 8 {
				l, err := s.Acquire(ctx, "mx")
				if err != nil {
					errs <- err
					return
				}
				if inside.Add(1) != 1 {
					errs <- errors.New("two holders at once")
				}
				if err := fence.Admit("mx", l.Token()); err != nil {
					errs <- err
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				if err := l.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A waiter whose own replica is cut off while it waits: its Acquire ends
// with ErrSessionExpired once its lease runs out, and it never gets the
// lock.
func TestHiddenWaiterCutOffEnds(t *testing.T) {
	t.Parallel()
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	f := follower(c, ld)
	ctx := testCtx(t, 30*time.Second)
	h := newSession(t, c.Node(ld))
	l, err := h.Acquire(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	w := newSession(t, c.Node(f), quorumlock.WithTTL(2*time.Second))
	res := acquireAsync(ctx, w, "w")
	hidWaitWaiters(t, c.Node(ld), "w", []uint64{w.ID()})
	c.Isolate(f)
	select {
	case r := <-res:
		if !errors.Is(r.err, quorumlock.ErrSessionExpired) {
			t.Fatalf("cut-off waiter: %v, %v", r.l, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cut-off waiter still waiting 10 s later")
	}
	// Its place in the queue goes once the cluster expires the session.
	hidWaitWaiters(t, c.Node(ld), "w", nil)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := c.Node(ld).Holder(ctx, "w")
	if err != nil || info.Holder != 0 {
		t.Fatalf("after release: %+v, %v", info, err)
	}
}

// The only leader's session expires (its replica is cut off): Leader on
// the majority then answers ErrNoLeader and Observe reports "no leader".
func TestHiddenLeaderExpiryLeavesNoLeader(t *testing.T) {
	t.Parallel()
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	victim := follower(c, ld)
	ctx := testCtx(t, 30*time.Second)
	s := newSession(t, c.Node(victim), quorumlock.WithTTL(2*time.Second))
	lead, err := s.Elect(ctx, "svc", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	events := c.Node(ld).Observe(ctx, "svc")
	if ev := nextEvent(t, events); ev.Epoch != lead.Epoch() {
		t.Fatalf("event %+v", ev)
	}
	c.Isolate(victim)
	ev := nextEvent(t, events)
	if ev.HasLeader() || ev.Epoch != lead.Epoch() {
		t.Fatalf("event after expiry %+v, want no leader (epoch %d)", ev, lead.Epoch())
	}
	if !closed(lead.Done()) {
		t.Fatal("cluster dropped the leader before its Done closed")
	}
	if _, err := c.Node(ld).Leader(ctx, "svc"); !errors.Is(err, quorumlock.ErrNoLeader) {
		t.Fatalf("Leader: %v, want ErrNoLeader", err)
	}
}

// A leaderless window shorter than the TTL loses no lock and expires no
// session (issue 2), also for a session that calls Acquire or TryAcquire
// with a short deadline during the window (here: two of three replicas
// down). The call returns within its ctx with ctx's error joined with
// ErrWithdrawPending; the session keeps lock A; once a leader is back,
// the session neither holds nor waits for B (the withdrawal completes in
// the background, releasing a grant that won the race), and it can take B
// again. (Before, the session was abandoned and lost A.)
func TestHiddenShortAcquireDuringElectionKeepsSession(t *testing.T) {
	for _, tc := range []struct {
		name      string
		try       bool
		heldByAny bool // B is held by another session (the call waits)
	}{
		{"Acquire/free", false, false},
		{"Acquire/held", false, true},
		{"TryAcquire/free", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The README's timing: 1 s election timeout, 10 s TTL.
			c := testcluster.New(t, testcluster.Options{Size: 3, TickInterval: 100 * time.Millisecond, ElectionTicks: 10, SessionTTL: 10 * time.Second})
			ld := c.WaitLeader(20 * time.Second)
			f := follower(c, ld)
			third := follower(c, ld, f)
			ctx := testCtx(t, 60*time.Second)
			s := newSession(t, c.Node(f))
			a, err := s.Acquire(ctx, "A")
			if err != nil {
				t.Fatal(err)
			}
			var other *quorumlock.Lock
			if tc.heldByAny {
				o := newSession(t, c.Node(f))
				if other, err = o.Acquire(ctx, "B"); err != nil {
					t.Fatal(err)
				}
			}
			// No quorum until the other two come back.
			c.Stop(ld)
			c.Stop(third)
			actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			start := time.Now()
			if tc.try {
				_, err = s.TryAcquire(actx, "B")
			} else {
				_, err = s.Acquire(actx, "B")
			}
			cancel()
			if took := time.Since(start); took > 1500*time.Millisecond {
				t.Errorf("call with a 500 ms ctx took %v", took)
			}
			if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, quorumlock.ErrWithdrawPending) || errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Fatalf("short call without quorum: %v, want the deadline and ErrWithdrawPending only", err)
			}
			if s.Err() != nil || closed(a.Lost()) {
				t.Fatalf("the call ended the session: %v", s.Err())
			}
			c.Restart(ld)
			c.Restart(third)
			nl := c.WaitLeader(20 * time.Second)
			deadline := time.Now().Add(10 * time.Second)
			for {
				info, err := c.Node(nl).Holder(testCtx(t, 5*time.Second), "B")
				if err == nil && info.Holder != s.ID() && !slices.Contains(info.Waiters, s.ID()) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("B after the outage: %+v, %v; the session still holds or waits for it", info, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if s.Err() != nil || closed(a.Lost()) {
				t.Fatalf("a leaderless window shorter than the TTL lost lock A: %v", s.Err())
			}
			info, err := c.Node(nl).Holder(ctx, "A")
			if err != nil || info.Holder != s.ID() || info.Token != a.Token() {
				t.Fatalf("A: %+v, %v", info, err)
			}
			if other != nil {
				if err := other.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			b, err := s.Acquire(ctx, "B")
			if err != nil {
				t.Fatalf("Acquire B after the outage: %v", err)
			}
			if err := b.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A holder that never releases: every replica restarts (the holder's
// session dies with its replica); after the restart the lock is granted
// to a new session, once the cluster expires the old one, with a larger
// token, and a Fence refuses the old token.
func TestHiddenTokenAfterRestartWithoutRelease(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	ld := c.WaitLeader(10 * time.Second)
	ctx := testCtx(t, 60*time.Second)
	s := newSession(t, c.Node(ld))
	old, err := s.Acquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	fence := quorumlock.NewFence()
	if err := fence.Admit("r", old.Token()); err != nil {
		t.Fatal(err)
	}
	c.StopAll()
	if !closed(old.Lost()) {
		t.Fatal("Lost open after the holder's replica stopped")
	}
	for _, id := range c.IDs() {
		c.Restart(id)
	}
	nl := c.WaitLeader(15 * time.Second)
	n := newSession(t, c.Node(nl))
	l, err := n.Acquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() <= old.Token() {
		t.Fatalf("token %d after %d", l.Token(), old.Token())
	}
	if err := fence.Admit("r", l.Token()); err != nil {
		t.Fatal(err)
	}
	if err := fence.Admit("r", old.Token()); !errors.Is(err, quorumlock.ErrStaleToken) {
		t.Fatalf("old token admitted after the new one: %v", err)
	}
}
