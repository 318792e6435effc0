package quorumlock_test

import (
	"context"
	"crypto/tls"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

func dial(t *testing.T, addrs []string, opts ...quorumlock.ClientOption) *quorumlock.Client {
	t.Helper()
	opts = append([]quorumlock.ClientOption{quorumlock.WithSessionTTL(2 * time.Second), quorumlock.WithElectionTimeout(100 * time.Millisecond)}, opts...)
	cl, err := quorumlock.Dial(testCtx(t, 10*time.Second), addrs, opts...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func addrsOf(c *testcluster.Cluster, ids ...uint64) []string {
	var out []string
	for _, id := range ids {
		out = append(out, c.Peers()[id])
	}
	return out
}

// A remote session behaves like one opened on a replica: same locks, same
// tokens, same errors; the two contend fairly.
func TestClientSessionsAndReads(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	cl := dial(t, addrsOf(c, c.IDs()...))
	ctx := testCtx(t, 10*time.Second)
	rs, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	local := newSession(t, c.Node(lead))
	rl, err := rs.Acquire(ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := local.TryAcquire(ctx, "shared"); !errors.Is(err, quorumlock.ErrLocked) {
		t.Fatalf("local TryAcquire: %v", err)
	}
	info, err := cl.Holder(ctx, "shared")
	if err != nil || info.Holder != rs.ID() || info.Token != rl.Token() {
		t.Fatalf("client Holder: %+v %v", info, err)
	}
	if _, err := rs.Acquire(ctx, "bad\x00name"); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Fatalf("bad name: %v", err)
	}
	ld, err := rs.Elect(ctx, "role", []byte("remote"))
	if err != nil {
		t.Fatal(err)
	}
	li, err := cl.Leader(ctx, "role")
	if err != nil || li.Session != rs.ID() || string(li.Value) != "remote" || li.Epoch != ld.Epoch() {
		t.Fatalf("client Leader: %+v %v", li, err)
	}
	if err := rl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ll := mustAcquire(t, local, "shared")
	if ll.Token() <= rl.Token() {
		t.Fatal("token did not grow")
	}

	// Operator views and revocation.
	locks, more, err := cl.Locks(ctx, "", 10)
	if err != nil || more || len(locks) != 2 || !locks[0].Role || locks[0].Name != "role" || locks[1].Name != "shared" {
		t.Fatalf("Locks: %+v more=%v %v", locks, more, err)
	}
	sessions, _, err := cl.Sessions(ctx, 0, 100)
	if err != nil || !slices.ContainsFunc(sessions, func(s quorumlock.SessionEntry) bool { return s.ID == rs.ID() && s.Held == 1 }) {
		t.Fatalf("Sessions: %+v %v", sessions, err)
	}
	if err := cl.RevokeSession(ctx, rs.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ld.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("revoked session's leadership not reported lost")
	}
	if _, err := cl.Leader(ctx, "role"); !errors.Is(err, quorumlock.ErrNoLeader) {
		t.Fatalf("after revoke: %v", err)
	}
	if err := cl.RevokeSession(ctx, rs.ID()); !errors.Is(err, quorumlock.ErrSessionExpired) {
		t.Fatalf("second revoke: %v", err)
	}
}

// A client given only a follower's address is redirected to the leader.
func TestClientFollowsLeaderHint(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	cl := dial(t, addrsOf(c, follower(c, lead)))
	ctx := testCtx(t, 10*time.Second)
	s, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if info := holder(t, c.Node(lead), "x"); info.Holder != s.ID() || info.Token != l.Token() {
		t.Fatalf("%+v", info)
	}
	// Heartbeats follow the hint too: the session outlives two TTLs.
	time.Sleep(2 * 2 * time.Second)
	if closed(s.Done()) {
		t.Fatalf("session through a follower ended: %v", s.Err())
	}
}

// The replica a waiting Acquire talks to dies: the client moves to another
// replica, re-sends the same request, and the outcome is exactly one grant.
func TestClientReplicaLossMidAcquire(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	h := newSession(t, c.Node(follower(c, lead)))
	hl := mustAcquire(t, h, "m")
	cl := dial(t, addrsOf(c, lead, follower(c, lead)))
	ctx := testCtx(t, 20*time.Second)
	w, err := cl.NewSession(ctx, quorumlock.WithTTL(4*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var wl *quorumlock.Lock
	go func() {
		var err error
		wl, err = w.Acquire(ctx, "m")
		got <- err
	}()
	waitQueued(t, c.Node(lead), "m", w.ID())
	c.Stop(lead)
	newLead := c.WaitLeader(5 * time.Second)
	time.Sleep(300 * time.Millisecond)
	if info := holder(t, c.Node(newLead), "m"); !slices.Equal(info.Waiters, []uint64{w.ID()}) {
		t.Fatalf("waiters after failover: %+v", info)
	}
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Acquire across the replica loss: %v", err)
	}
	if info := holder(t, c.Node(newLead), "m"); info.Holder != w.ID() || info.Token != wl.Token() || len(info.Waiters) != 0 {
		t.Fatalf("after grant: %+v (token %d)", info, wl.Token())
	}
}

// --- TLS ---

// Mutual TLS: the cluster forms over TLS, a trusted client works, a client
// without a certificate or with one from another CA is refused, and a
// replica with an untrusted certificate cannot take part.
func TestMutualTLS(t *testing.T) {
	good, evil := quorumlock.NewTestCA(t, "good CA"), quorumlock.NewTestCA(t, "evil CA")
	c := testcluster.New(t, testcluster.Options{Size: 3, Configure: func(cfg *quorumlock.Config) {
		ca := good
		if cfg.ID == 3 {
			ca = evil // replica 3 is a stranger
		}
		cfg.TLS, cfg.PeerTLS = ca.ServerTLS(t, "replica"), ca.ClientTLS(t, "replica")
	}})
	lead := c.WaitLeader(10 * time.Second)
	if lead == 3 {
		t.Fatal("the untrusted replica leads")
	}
	cl := dial(t, addrsOf(c, 1, 2), quorumlock.WithTLS(good.ClientTLS(t, "app")))
	ctx := testCtx(t, 10*time.Second)
	s, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "tls"); err != nil {
		t.Fatal(err)
	}
	if st := c.Node(3).Status(); st.Leader != 0 && st.Term > 0 && st.Commit > 0 && st.Applied >= c.Node(lead).Status().Applied {
		t.Fatalf("the untrusted replica follows the cluster: %+v", st)
	}
	for name, opt := range map[string]quorumlock.ClientOption{
		"no certificate": quorumlock.WithTLS(&tls.Config{RootCAs: good.Pool, MinVersion: tls.VersionTLS13}),
		"untrusted CA":   quorumlock.WithTLS(evil.ClientTLS(t, "intruder")),
		"plaintext":      quorumlock.WithSessionTTL(2 * time.Second),
	} {
		dctx, cancel := context.WithTimeout(context.Background(), time.Second)
		bad, err := quorumlock.Dial(dctx, addrsOf(c, 1, 2), opt)
		cancel()
		if err == nil {
			bad.Close()
			t.Fatalf("%s: an untrusted client connected", name)
		}
	}
}
