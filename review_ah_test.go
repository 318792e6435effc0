package quorumlock_test

// Review AH: black-box tests written from the issue texts alone (issues 2, 4
// and 5), the way a test writer who knows etcd, Consul or ZooKeeper would
// read them. Each test names the bullet or API line it checks.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
)

// ahWaitClosed fails the test unless ch closes within d.
func ahWaitClosed(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s did not close within %v", what, d)
	}
}

// Issue 2, bad input: a Start refused for ID 0, an ID not in Peers or
// duplicate addresses gives a clear error and "nothing else changes": the
// data directory it names is not created.
func TestAHBadConfigCreatesNothing(t *testing.T) {
	base := t.TempDir()
	cases := map[string]quorumlock.Config{
		"id0":        {ID: 0, Peers: map[uint64]string{1: "127.0.0.1:27701"}},
		"notInPeers": {ID: 2, Peers: map[uint64]string{1: "127.0.0.1:27701"}},
		"dupAddr":    {ID: 1, Peers: map[uint64]string{1: "127.0.0.1:27701", 2: "127.0.0.1:27701", 3: "127.0.0.1:27703"}},
		"ttlLow":     {ID: 1, Peers: map[uint64]string{1: "127.0.0.1:27701"}, SessionTTL: time.Millisecond},
		"ttlNeg":     {ID: 1, Peers: map[uint64]string{1: "127.0.0.1:27701"}, SessionTTL: -time.Second},
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			cfg.DataDir = filepath.Join(base, name)
			n, err := quorumlock.Start(testCtx(t, 10*time.Second), cfg)
			if err == nil {
				n.Close()
				t.Fatal("Start accepted a bad config")
			}
			if !errors.Is(err, quorumlock.ErrInvalidConfig) {
				t.Fatalf("Start: %v, want ErrInvalidConfig", err)
			}
			if _, serr := os.Stat(cfg.DataDir); !os.IsNotExist(serr) {
				t.Fatalf("refused Start left %s behind (stat: %v)", cfg.DataDir, serr)
			}
		})
	}
}

// Issue 2: TTL out of range through WithTTL is a clear error, and the
// session table does not change (no session is opened).
func TestAHWithTTLOutOfRange(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	n := nodes[lead]
	for _, d := range []time.Duration{-time.Second, 0, time.Nanosecond, 365 * 24 * time.Hour} {
		s, err := n.NewSession(testCtx(t, 10*time.Second), quorumlock.WithTTL(d))
		if err == nil {
			s.Close(testCtx(t, 5*time.Second))
			t.Fatalf("WithTTL(%v) accepted", d)
		}
		if !errors.Is(err, quorumlock.ErrInvalidTTL) {
			t.Fatalf("WithTTL(%v): %v, want ErrInvalidTTL", d, err)
		}
	}
}

// Issue 2: Session.Close "releases every lock of the session and ends it":
// every lock is free at once for a linearizable read on another replica, the
// session's Done and the locks' Lost channels close, and the session can no
// longer acquire.
func TestAHSessionCloseReleasesAll(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	f := nodes[(lead+1)%3]
	s := specSession(testCtx(t, 10*time.Second), t, f)
	var locks []*quorumlock.Lock
	for _, name := range []string{"a", "b", "c"} {
		l, err := s.Acquire(testCtx(t, 10*time.Second), name)
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l)
	}
	if err := s.Close(testCtx(t, 10*time.Second)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	ahWaitClosed(t, s.Done(), time.Second, "Session.Done after Close")
	for _, l := range locks {
		ahWaitClosed(t, l.Lost(), time.Second, "Lock.Lost after Session.Close")
		info, err := nodes[(lead+2)%3].Holder(testCtx(t, 10*time.Second), l.Name())
		if err != nil {
			t.Fatal(err)
		}
		if info.Holder != 0 || info.Token != 0 {
			t.Fatalf("%q after Session.Close: %+v, want free", l.Name(), info)
		}
		if err := l.Release(testCtx(t, 5*time.Second)); err == nil {
			t.Fatalf("Release of %q after Session.Close succeeded", l.Name())
		}
	}
	if _, err := s.Acquire(testCtx(t, 5*time.Second), "d"); err == nil {
		t.Fatal("Acquire on a closed session succeeded")
	}
}

// Issue 2: Lock.Token is "the raft index of the granting entry": tokens are
// therefore increasing across different names too, and at most the commit
// index of the replica that served the grant.
func TestAHTokenIsLogIndex(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	n := nodes[lead]
	s := specSession(testCtx(t, 10*time.Second), t, n)
	var last quorumlock.Token
	for _, name := range []string{"x", "y", "z"} {
		l, err := s.Acquire(testCtx(t, 10*time.Second), name)
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= last {
			t.Fatalf("token of %q %d not above the previous grant's %d", name, l.Token(), last)
		}
		if c := n.Status().Commit; uint64(l.Token()) > c {
			t.Fatalf("token %d above the commit index %d", l.Token(), c)
		}
		last = l.Token()
	}
}

// Issue 2: Holder reports "holder session, token, waiters": the waiters in
// FIFO order, by session ID, on any replica.
func TestAHHolderReportsWaiters(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	specLeader(t, nodes)
	ctx := testCtx(t, 20*time.Second)
	s1 := specSession(ctx, t, nodes[0])
	s2 := specSession(ctx, t, nodes[1])
	s3 := specSession(ctx, t, nodes[2])
	l1, err := s1.Acquire(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *quorumlock.Lock, 2)
	go func() {
		l, err := s2.Acquire(ctx, "q")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	hidWaitWaiters(t, nodes[2], "q", []uint64{s2.ID()})
	go func() {
		l, err := s3.Acquire(ctx, "q")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	hidWaitWaiters(t, nodes[0], "q", []uint64{s2.ID(), s3.ID()})
	info, err := nodes[1].Holder(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "q" || info.Holder != s1.ID() || info.Token != l1.Token() {
		t.Fatalf("Holder: %+v, want holder %d token %d", info, s1.ID(), l1.Token())
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-got
	if l2.Session() != s2 || l2.Token() <= l1.Token() {
		t.Fatalf("after release: granted to session %d token %d", l2.Session().ID(), l2.Token())
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l3 := <-got
	if l3.Session() != s3 || l3.Token() <= l2.Token() {
		t.Fatalf("second hand-off: granted to session %d token %d", l3.Session().ID(), l3.Token())
	}
}

// Issue 2: Release is "fenced: releases this grant only": the handle of an
// earlier grant cannot free a later grant of the same lock to the same
// session.
func TestAHReleaseOldGrantOnly(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	ctx := testCtx(t, 20*time.Second)
	s := specSession(ctx, t, nodes[lead])
	old, err := s.Acquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Release(ctx); err != nil {
		t.Fatal(err)
	}
	cur, err := s.Acquire(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if cur.Token() <= old.Token() {
		t.Fatalf("re-grant token %d not above %d", cur.Token(), old.Token())
	}
	if err := old.Release(ctx); !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Fatalf("Release of the old grant: %v, want ErrNotHeld", err)
	}
	info, err := nodes[(lead+1)%3].Holder(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if info.Holder != s.ID() || info.Token != cur.Token() {
		t.Fatalf("the old handle freed the new grant: %+v", info)
	}
	select {
	case <-cur.Lost():
		t.Fatal("the current grant's Lost closed after the old handle's Release")
	default:
	}
}

// Issue 2, Acquire cancelled while waiting: the caller gets ctx's error
// (errors.Is works with the ctx error), the session is off the queue, and
// a later release goes to nobody.
func TestAHCancelledAcquireLeavesQueue(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	ctx := testCtx(t, 20*time.Second)
	holder := specSession(ctx, t, nodes[lead])
	waiter := specSession(ctx, t, nodes[(lead+1)%3])
	l, err := holder.Acquire(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	wl, err := waiter.Acquire(wctx, "w")
	if err == nil {
		t.Fatalf("Acquire granted %d while held", wl.Token())
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled Acquire: %v, want one wrapping context.DeadlineExceeded", err)
	}
	info, err := nodes[(lead+2)%3].Holder(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Waiters) != 0 {
		t.Fatalf("waiters after the cancelled Acquire: %v", info.Waiters)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	info, err = nodes[(lead+2)%3].Holder(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	if info.Holder != 0 {
		t.Fatalf("after release the lock went to %d", info.Holder)
	}
	select {
	case <-waiter.Done():
		t.Fatal("the waiter's session ended")
	default:
	}
}

// Issue 2: TryAcquire of a free lock grants it; of a held one returns
// ErrLocked and does not queue the caller.
func TestAHTryAcquireDoesNotQueue(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	ctx := testCtx(t, 20*time.Second)
	a := specSession(ctx, t, nodes[(lead+1)%3])
	b := specSession(ctx, t, nodes[(lead+2)%3])
	la, err := a.TryAcquire(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "t"); !errors.Is(err, quorumlock.ErrLocked) {
		t.Fatalf("TryAcquire of a held lock: %v, want ErrLocked", err)
	}
	info, err := nodes[lead].Holder(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	if info.Holder != a.ID() || len(info.Waiters) != 0 {
		t.Fatalf("after a failed TryAcquire: %+v", info)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if info, _ = nodes[lead].Holder(ctx, "t"); info.Holder != 0 {
		t.Fatalf("released lock held by %d", info.Holder)
	}
}

// ahNext returns the next event of an Observe stream within 10 s.
func ahNext(t *testing.T, ch <-chan quorumlock.LeaderInfo) quorumlock.LeaderInfo {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("Observe channel closed")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no Observe event within 10 s")
	}
	return quorumlock.LeaderInfo{}
}

// Issue 4: Observe delivers "every change, in epoch order, including 'no
// leader'": the first event is the current state (no leader), then the
// leader with its value, a Proclaim's new value under the same epoch, "no
// leader" after Resign, and the next candidate with a larger epoch. Leader
// agrees with each state, and gives ErrNoLeader when there is none.
func TestAHObserveEveryChange(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	ctx := testCtx(t, 30*time.Second)
	obs := nodes[(lead+2)%3]
	if _, err := obs.Leader(ctx, "sched"); !errors.Is(err, quorumlock.ErrNoLeader) {
		t.Fatalf("Leader of an empty role: %v, want ErrNoLeader", err)
	}
	ch := obs.Observe(ctx, "sched")
	if ev := ahNext(t, ch); ev.HasLeader() || ev.Role != "sched" {
		t.Fatalf("first event %+v, want no leader for sched", ev)
	}
	a, err := nodes[lead].Elect(ctx, "sched", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	ev := ahNext(t, ch)
	if ev.Session != a.Session().ID() || ev.Epoch != a.Epoch() || string(ev.Value) != "a" {
		t.Fatalf("event %+v, want session %d epoch %d value a", ev, a.Session().ID(), a.Epoch())
	}
	li, err := obs.Leader(ctx, "sched")
	if err != nil || li.Session != a.Session().ID() || li.Epoch != a.Epoch() || string(li.Value) != "a" {
		t.Fatalf("Leader: %+v, %v", li, err)
	}
	if err := a.Proclaim(ctx, []byte("a2")); err != nil {
		t.Fatal(err)
	}
	ev = ahNext(t, ch)
	if ev.Session != a.Session().ID() || ev.Epoch != a.Epoch() || string(ev.Value) != "a2" {
		t.Fatalf("event after Proclaim %+v, want epoch %d value a2", ev, a.Epoch())
	}
	if li, err = obs.Leader(ctx, "sched"); err != nil || string(li.Value) != "a2" {
		t.Fatalf("Leader after Proclaim: %+v, %v", li, err)
	}
	// A second candidate waits behind a.
	bc := make(chan *quorumlock.Leadership, 1)
	go func() {
		b, err := nodes[(lead+1)%3].Elect(ctx, "sched", []byte("b"))
		if err != nil {
			t.Error(err)
		}
		bc <- b
	}()
	time.Sleep(200 * time.Millisecond) // let b queue (either order is checked the same)
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	ahWaitClosed(t, a.Done(), time.Second, "Done after Resign")
	if a.Context().Err() == nil {
		t.Fatal("Context not cancelled after Resign")
	}
	ahWaitClosed(t, a.Session().Done(), 5*time.Second, "Node.Elect's dedicated session after Resign")
	if err := a.Proclaim(ctx, []byte("late")); err == nil {
		t.Fatal("Proclaim after Resign succeeded")
	}
	ev = ahNext(t, ch)
	if ev.HasLeader() {
		t.Fatalf("event after Resign %+v, want no leader first", ev)
	}
	b := <-bc
	if b == nil {
		t.FailNow()
	}
	if b.Epoch() <= a.Epoch() {
		t.Fatalf("next epoch %d not above %d", b.Epoch(), a.Epoch())
	}
	ev = ahNext(t, ch)
	if ev.Session != b.Session().ID() || ev.Epoch != b.Epoch() || string(ev.Value) != "b" {
		t.Fatalf("event %+v, want b at epoch %d", ev, b.Epoch())
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if ev = ahNext(t, ch); ev.HasLeader() || ev.Epoch < b.Epoch() {
		t.Fatalf("event after last Resign %+v", ev)
	}
	if _, err := obs.Leader(ctx, "sched"); !errors.Is(err, quorumlock.ErrNoLeader) {
		t.Fatalf("Leader after every resign: %v, want ErrNoLeader", err)
	}
}

// Issue 4: "Roles live in their own namespace so a role never collides with
// a lock name": a lock and a role of the same name are both taken at once,
// and Holder and Leader each see only their own.
func TestAHRoleAndLockSameName(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	ctx := testCtx(t, 20*time.Second)
	s1 := specSession(ctx, t, nodes[lead])
	s2 := specSession(ctx, t, nodes[(lead+1)%3])
	l, err := s1.TryAcquire(ctx, "svc")
	if err != nil {
		t.Fatal(err)
	}
	ld, err := s2.Elect(ctx, "svc", nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := nodes[2].Holder(ctx, "svc")
	if err != nil || h.Holder != s1.ID() || h.Token != l.Token() {
		t.Fatalf("Holder: %+v, %v", h, err)
	}
	li, err := nodes[2].Leader(ctx, "svc")
	if err != nil || li.Session != s2.ID() || li.Epoch != ld.Epoch() {
		t.Fatalf("Leader: %+v, %v", li, err)
	}
}

// Issue 5: a remote Session behaves like one on a replica: the same
// ErrLocked, FIFO hand-off with a larger token, Holder, Leader and Observe
// through the Client, and Client.Close reports its sessions lost.
func TestAHClientSameAPI(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	specLeader(t, nodes)
	ctx := testCtx(t, 30*time.Second)
	c := specDial(t, nodes)
	rs := specSession(ctx, t, c)
	ls := specSession(ctx, t, nodes[0])
	rl, err := rs.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ls.TryAcquire(ctx, "k"); !errors.Is(err, quorumlock.ErrLocked) {
		t.Fatalf("local TryAcquire of a remotely held lock: %v", err)
	}
	h, err := c.Holder(ctx, "k")
	if err != nil || h.Holder != rs.ID() || h.Token != rl.Token() {
		t.Fatalf("Client.Holder: %+v, %v", h, err)
	}
	ld, err := c.Elect(ctx, "role", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	li, err := c.Leader(ctx, "role")
	if err != nil || li.Epoch != ld.Epoch() || string(li.Value) != "v" {
		t.Fatalf("Client.Leader: %+v, %v", li, err)
	}
	ch := c.Observe(ctx, "role")
	if ev := ahNext(t, ch); ev.Epoch != ld.Epoch() {
		t.Fatalf("Client.Observe first event %+v", ev)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	ahWaitClosed(t, rs.Done(), time.Second, "remote Session.Done after Client.Close")
	ahWaitClosed(t, rl.Lost(), time.Second, "remote Lock.Lost after Client.Close")
	ahWaitClosed(t, ld.Done(), time.Second, "remote Leadership.Done after Client.Close")
	if _, err := rs.Acquire(ctx, "k2"); !errors.Is(err, quorumlock.ErrClosed) {
		t.Fatalf("Acquire after Client.Close: %v, want ErrClosed", err)
	}
	if _, err := c.Holder(ctx, "k"); !errors.Is(err, quorumlock.ErrClosed) {
		t.Fatalf("Holder after Client.Close: %v, want ErrClosed", err)
	}
}

// Issue 2: Node.Close "stops the replica; sessions opened through it are
// reported lost", and the lock is freed by the cluster after the TTL, so
// a waiter on another replica gets it with a larger token.
func TestAHNodeCloseLosesSessions(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	ctx := testCtx(t, 30*time.Second)
	victim := nodes[(lead+1)%3]
	s, err := victim.NewSession(ctx, quorumlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	other := specSession(ctx, t, nodes[lead])
	if err := victim.Close(); err != nil {
		t.Fatal(err)
	}
	ahWaitClosed(t, s.Done(), time.Second, "Session.Done after Node.Close")
	ahWaitClosed(t, l.Lost(), time.Second, "Lock.Lost after Node.Close")
	l2, err := other.Acquire(ctx, "n")
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("token after the TTL %d not above %d", l2.Token(), l.Token())
	}
	if _, err := s.Acquire(ctx, "m"); err == nil {
		t.Fatal("Acquire through a closed Node succeeded")
	}
	if _, err := victim.Holder(ctx, "n"); !errors.Is(err, quorumlock.ErrClosed) {
		t.Fatalf("Holder on a closed Node: %v, want ErrClosed", err)
	}
}
