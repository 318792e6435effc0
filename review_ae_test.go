package quorumlock_test

// Review AE: public docstring promises that no other test checked, each
// on the cheapest cluster that shows it (one replica, which leads, so the
// in-process path; a Client where the remote path differs).

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quorumlock/quorumlock"
)

// Config: "Start applies the defaults to a copy; the caller's value is
// never modified" (the zero fields stay zero, Peers keeps its entries),
// and the replica keeps its own Peers: a later change of the caller's map
// does not reach it.
func TestReviewAEStartLeavesCallersConfig(t *testing.T) {
	var cfg quorumlock.Config
	nodes := specCluster(t, 1, func(c *quorumlock.Config) {
		c.TickInterval, c.ElectionTicks = 0, 0
		cfg = *c
	})
	peers := maps.Clone(cfg.Peers)
	if cfg.SessionTTL != 0 || cfg.TickInterval != 0 || cfg.ElectionTicks != 0 || cfg.ClusterName != "" ||
		cfg.LogBackend != "" || cfg.MaxNameBytes != 0 || cfg.MaxSessions != 0 || cfg.Clock != nil || cfg.Logger != nil {
		t.Fatalf("the caller's Config was given defaults: %+v", cfg)
	}
	// specCluster passed its own copy to Start; this checks the same
	// through a Config the test keeps.
	again := cfg
	again.ID = 1
	again.DataDir = t.TempDir()
	again.Listener = nil
	again.Peers = map[uint64]string{1: "127.0.0.1:0"} // refused: port 0 without Listener
	before := maps.Clone(again.Peers)
	if _, err := quorumlock.Start(testCtx(t, 10*time.Second), again); !errors.Is(err, quorumlock.ErrInvalidConfig) {
		t.Fatalf("Start with port 0 and no Listener: %v, want ErrInvalidConfig", err)
	}
	if !maps.Equal(again.Peers, before) || again.SessionTTL != 0 {
		t.Fatalf("a refused Start changed the caller's Config: %+v", again)
	}
	if !maps.Equal(cfg.Peers, peers) {
		t.Fatalf("Start changed the caller's Peers: %v, was %v", cfg.Peers, peers)
	}
	// Defaults applied inside: the default TTL is 10 s.
	s := specSession(testCtx(t, 10*time.Second), t, nodes[0])
	if s.TTL() != 10*time.Second {
		t.Fatalf("default session TTL %v, want 10s", s.TTL())
	}
	// The caller's map changing later does not move the replica.
	for id := range cfg.Peers {
		cfg.Peers[id] = "127.0.0.1:1"
	}
	if _, err := nodes[0].NewSession(testCtx(t, 10*time.Second)); err != nil {
		t.Fatalf("NewSession after the caller rewrote its Peers map: %v", err)
	}
}

// WithTTL: "Unlike Config.SessionTTL, it is not checked against the
// cluster's election timeout". With the default 1 s election timeout a
// Config.SessionTTL of 2 s is refused, and WithTTL(1s) (MinSessionTTL) is
// accepted: the session opens with that TTL, and the cluster lists it.
func TestReviewAEWithTTLNotCheckedAgainstElectionTimeout(t *testing.T) {
	cfg := quorumlock.Config{ID: 1, Peers: map[uint64]string{1: "127.0.0.1:1"}, DataDir: t.TempDir(), SessionTTL: 2 * time.Second}
	if _, err := quorumlock.Start(testCtx(t, 10*time.Second), cfg); !errors.Is(err, quorumlock.ErrInvalidConfig) {
		t.Fatalf("Start with SessionTTL 2s and a 1s election timeout: %v, want ErrInvalidConfig", err)
	}
	nodes := specCluster(t, 1, func(c *quorumlock.Config) { c.TickInterval, c.ElectionTicks = 100*time.Millisecond, 10 })
	specLeader(t, nodes)
	ctx := testCtx(t, 10*time.Second)
	s := specSession(ctx, t, nodes[0], quorumlock.WithTTL(quorumlock.MinSessionTTL))
	if s.TTL() != time.Second {
		t.Fatalf("TTL %v, want 1s", s.TTL())
	}
	cl := specDial(t, nodes)
	list, _, err := cl.Sessions(ctx, s.ID()-1, 1)
	if err != nil || len(list) != 1 || list[0].ID != s.ID() || list[0].TTL != time.Second {
		t.Fatalf("Sessions: %+v, %v; want session %d with TTL 1s", list, err, s.ID())
	}
}

// Client.Sessions: SessionEntry.Held counts the locks and roles a session
// holds, not those it waits for (which Holder lists as Waiters), and
// Client.Locks lists a lock with Role false and no Value, a role with
// Role true, its bare name and its value.
func TestReviewAEListingsHeldAndRoleEntries(t *testing.T) {
	nodes := specCluster(t, 1, nil)
	specLeader(t, nodes)
	ctx := testCtx(t, 20*time.Second)
	n := nodes[0]
	a := specSession(ctx, t, n)
	b := specSession(ctx, t, n)
	mustAcquire(t, a, "ae/x")
	mustAcquire(t, b, "ae/y")
	if _, err := b.Elect(ctx, "ae/role", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	wait := acquireQueued(t, ctx, b, n, "ae/x") // b waits for a's lock
	cl := specDial(t, nodes)
	list, _, err := cl.Sessions(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	held := map[uint64]int{}
	for _, e := range list {
		held[e.ID] = e.Held
	}
	if held[a.ID()] != 1 || held[b.ID()] != 2 {
		t.Fatalf("Held: a %d (want 1), b %d (want 2: a lock and a role, not the lock it waits for)", held[a.ID()], held[b.ID()])
	}
	ents, _, err := cl.Locks(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var sawRole, sawLock bool
	for _, e := range ents {
		switch e.Name {
		case "ae/role":
			sawRole = true
			if !e.Role || !bytes.Equal(e.Value, []byte("v1")) || e.Holder != b.ID() {
				t.Errorf("role entry %+v, want Role, value v1, holder %d", e, b.ID())
			}
		case "ae/x":
			sawLock = true
			if e.Role || e.Value != nil || e.Holder != a.ID() || len(e.Waiters) != 1 || e.Waiters[0] != b.ID() {
				t.Errorf("lock entry %+v, want no Role, no Value, holder %d, waiter %d", e, a.ID(), b.ID())
			}
		}
	}
	if !sawRole || !sawLock {
		t.Fatalf("listing %+v lacks the role or the lock", ents)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-wait; r.err != nil {
		t.Fatalf("waiting Acquire after the holder closed: %v", r.err)
	}
}

// LeaderInfo.Value: "Every read and every Observe event has its own copy";
// and the caller keeps its slices: changing the value passed to Elect or
// Proclaim after the call returns changes nothing published. On the
// leader replica (in process) and through a Client.
func TestReviewAELeaderValueCopies(t *testing.T) {
	nodes := specCluster(t, 1, nil)
	specLeader(t, nodes)
	ctx := testCtx(t, 20*time.Second)
	cl := specDial(t, nodes)
	for _, o := range []opener{nodes[0], cl} {
		role := "ae/copies/" + where(o)
		s := specSession(ctx, t, o)
		v := []byte("first")
		ld, err := s.Elect(ctx, role, v)
		if err != nil {
			t.Fatal(err)
		}
		copy(v, "XXXXX")
		info, err := o.Leader(ctx, role)
		if err != nil || string(info.Value) != "first" {
			t.Fatalf("%s: Leader after the caller changed Elect's slice: %q, %v; want first", where(o), info.Value, err)
		}
		info.Value[0] = 'Z'
		if again, err := o.Leader(ctx, role); err != nil || string(again.Value) != "first" {
			t.Fatalf("%s: Leader after the reader changed an earlier read's Value: %q, %v", where(o), again.Value, err)
		}
		p := []byte("second")
		if err := ld.Proclaim(ctx, p); err != nil {
			t.Fatal(err)
		}
		copy(p, "YYYYYY")
		obs := o.Observe(ctx, role)
		ev := <-obs
		if string(ev.Value) != "second" {
			t.Fatalf("%s: Observe after the caller changed Proclaim's slice: %q, want second", where(o), ev.Value)
		}
		ev.Value[0] = 'Q'
		if again, err := o.Leader(ctx, role); err != nil || string(again.Value) != "second" {
			t.Fatalf("%s: Leader after the observer changed an event's Value: %q, %v", where(o), again.Value, err)
		}
		if err := ld.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Config.Listener: "Start takes ownership and Close closes it". A Start
// that fails (a bad Config, or a ctx already over) closes it too, so the
// caller's port is not left bound; one that succeeds serves on it
// (Node.Addr is its address) until Close closes it.
func TestReviewAEListenerOwnership(t *testing.T) {
	listen := func() (net.Listener, string) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l, l.Addr().String()
	}
	acceptFails := func(what string, l net.Listener) {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			c, err := l.Accept()
			if err == nil {
				c.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("%s: Accept on the listener: %v, want net.ErrClosed", what, err)
			}
		case <-time.After(5 * time.Second):
			l.Close()
			t.Fatalf("%s: the listener is still open", what)
		}
	}
	l, addr := listen()
	bad := quorumlock.Config{ID: 1, Peers: map[uint64]string{1: addr}, DataDir: t.TempDir(), Listener: l, ElectionTicks: 2}
	if _, err := quorumlock.Start(testCtx(t, 10*time.Second), bad); !errors.Is(err, quorumlock.ErrInvalidConfig) {
		t.Fatalf("Start with ElectionTicks 2: %v, want ErrInvalidConfig", err)
	}
	acceptFails("after a refused Config", l)

	l, addr = listen()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	cfg := quorumlock.Config{ID: 1, Peers: map[uint64]string{1: addr}, DataDir: t.TempDir(), Listener: l}
	if _, err := quorumlock.Start(gone, cfg); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start with an ended ctx: %v, want context.Canceled", err)
	}
	acceptFails("after a Start whose ctx had ended", l)

	l, addr = listen()
	cfg.Listener = l
	cfg.Peers = map[uint64]string{1: addr}
	n, err := quorumlock.Start(testCtx(t, 10*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n.Addr().String() != addr {
		n.Close()
		t.Fatalf("Addr %v, want the listener's %s", n.Addr(), addr)
	}
	if _, err := n.NewSession(testCtx(t, 10*time.Second)); err != nil {
		n.Close()
		t.Fatal(err)
	}
	n.Close()
	acceptFails("after Close", l)
}

// Config.PeerTLS: TLS and PeerTLS are set together; PeerTLS without TLS
// (a replica that would dial its peers over TLS while serving plaintext)
// is refused with ErrInvalidConfig naming PeerTLS, as TLS alone is.
func TestReviewAEPeerTLSAloneRefused(t *testing.T) {
	cfg := quorumlock.Config{ID: 1, Peers: map[uint64]string{1: "127.0.0.1:1"}, DataDir: t.TempDir(), PeerTLS: &tls.Config{}}
	n, err := quorumlock.Start(testCtx(t, 10*time.Second), cfg)
	if err == nil {
		n.Close()
	}
	if !errors.Is(err, quorumlock.ErrInvalidConfig) || !strings.Contains(err.Error(), "PeerTLS") {
		t.Fatalf("Start with PeerTLS and no TLS: %v, want ErrInvalidConfig naming PeerTLS", err)
	}
}

// ReplicaStatus.Err: the error of the call when ctx ended first, a gRPC
// status: DeadlineExceeded for a deadline, Canceled for a cancellation;
// Addr is still the address as given to Dial, and the view is zero.
func TestReviewAEClientStatusWhenCtxEnded(t *testing.T) {
	nodes := specCluster(t, 1, nil)
	specLeader(t, nodes)
	cl := specDial(t, nodes)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, c := range []struct {
		ctx  context.Context
		want codes.Code
	}{{cancelled, codes.Canceled}, {expired, codes.DeadlineExceeded}} {
		st := cl.Status(c.ctx)
		if len(st) != 1 || st[0].Addr != nodes[0].Addr().String() || st[0].ID != 0 || status.Code(st[0].Err) != c.want {
			t.Errorf("Status with ctx ended (%v): %+v, want one entry for %s with code %v", c.want, st, nodes[0].Addr(), c.want)
		}
	}
}

// Status: a stopped replica leads nothing, so its last view never names
// itself leader, even where it led until Close (it reported itself leader
// before): a program polling Status must not see a dead replica as the
// leader. The rest of its last view (ID, Term, Commit, Applied) stays; the
// view of a leader that handed over on Close names its successor
// (TestCloseHandsLeadershipOver).
func TestReviewAEStoppedReplicaNamesNoLeader(t *testing.T) {
	nodes := specCluster(t, 1, nil)
	n := nodes[specLeader(t, nodes)]
	s := specSession(testCtx(t, 10*time.Second), t, n)
	if _, err := s.Acquire(testCtx(t, 10*time.Second), "x"); err != nil {
		t.Fatal(err)
	}
	before := n.Status()
	if before.Leader != before.ID {
		t.Fatalf("the only replica's Status %+v does not name itself leader", before)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	after := n.Status()
	if after.Leader != 0 {
		t.Fatalf("Status after Close names leader %d, want 0: %+v", after.Leader, after)
	}
	if after.ID != before.ID || after.Term < before.Term || after.Applied < before.Applied || after.Commit < before.Commit {
		t.Fatalf("Status after Close %+v lost the last view %+v", after, before)
	}
}
