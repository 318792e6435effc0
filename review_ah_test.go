package quorumlock_test

// Review AH: black-box tests written from the issue texts alone (issues 2, 4
// and 5), the way a test writer who knows etcd, Consul or ZooKeeper would
// read them. Each test names the bullet or API line it checks.

import (
	"errors"
	"net"
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
// index of the replica that served the grant. That replica publishes its
// Status after the Ready whose apply answered the grant (a leader applies
// before it saves and publishes), so the check waits for the published
// commit index to reach the token; nothing else is proposed meanwhile, so
// a token past the grant's own entry would never be reached (CI, -race,
// saw the Status one entry behind).
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
		deadline := time.Now().Add(5 * time.Second)
		for n.Status().Commit < uint64(l.Token()) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if c := n.Status().Commit; uint64(l.Token()) > c {
			t.Fatalf("token %d above the commit index %d, 5 s after the grant", l.Token(), c)
		}
		last = l.Token()
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

// ahFreeAddrs returns n loopback addresses whose ports were free a moment
// ago (the replicas listen on them themselves, Config.Listener unset).
func ahFreeAddrs(t *testing.T, n int) map[uint64]string {
	t.Helper()
	peers := make(map[uint64]string, n)
	var ls []net.Listener
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		peers[uint64(i+1)] = l.Addr().String()
	}
	for _, l := range ls {
		l.Close()
	}
	return peers
}

// ahStartAll starts one replica per peer, listening on Peers[ID] (no
// Listener), with the given data directories.
func ahStartAll(t *testing.T, peers map[uint64]string, dirs map[uint64]string) map[uint64]*quorumlock.Node {
	t.Helper()
	nodes := make(map[uint64]*quorumlock.Node)
	for id := range peers {
		n, err := quorumlock.Start(testCtx(t, 10*time.Second), quorumlock.Config{
			ID: id, Peers: peers, DataDir: dirs[id],
			SessionTTL: 2 * time.Second, TickInterval: 20 * time.Millisecond, ElectionTicks: 10,
		})
		if err != nil {
			t.Fatalf("Start %d: %v", id, err)
		}
		nodes[id] = n
		t.Cleanup(func() { n.Close() })
	}
	return nodes
}

// Issue 2: "tokens strictly increase across a leader stop and restart of
// all replicas", and the lock table survives, through the public API alone:
// replicas listening on their Peers address are closed (the leader first)
// and started again at once on the same addresses and data directories.
// The lock held before is still held with its token after the restart,
// and the next grant, once its holder's session has expired, is larger.
func TestAHRestartAllSamePorts(t *testing.T) {
	peers := ahFreeAddrs(t, 3)
	dirs := map[uint64]string{}
	for id := range peers {
		dirs[id] = t.TempDir()
	}
	nodes := ahStartAll(t, peers, dirs)
	var lead *quorumlock.Node
	deadline := time.Now().Add(15 * time.Second)
	for lead == nil && time.Now().Before(deadline) {
		for _, n := range nodes {
			if st := n.Status(); st.Leader == st.ID {
				lead = n
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if lead == nil {
		t.Fatal("no leader")
	}
	ctx := testCtx(t, 60*time.Second)
	s, err := lead.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held, err := s.Acquire(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	if err := lead.Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	nodes = ahStartAll(t, peers, dirs)
	info, err := nodes[1].Holder(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	if info.Holder != s.ID() || info.Token != held.Token() {
		t.Fatalf("after restarting every replica: %+v, want holder %d token %d", info, s.ID(), held.Token())
	}
	s2, err := nodes[2].NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := s2.Acquire(ctx, "kept")
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= held.Token() {
		t.Fatalf("token after restart %d not above %d", l2.Token(), held.Token())
	}
}
