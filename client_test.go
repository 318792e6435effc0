package quorumlock_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
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

type pki struct {
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPool *x509.CertPool
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &pki{ca: ca, caKey: key, caPool: pool}
}

// leaf issues a certificate usable as server and client for 127.0.0.1.
func (p *pki) leaf(t *testing.T, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (p *pki) server(t *testing.T, name string) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.leaf(t, name)}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: p.caPool, MinVersion: tls.VersionTLS13}
}

func (p *pki) client(t *testing.T, name string) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{p.leaf(t, name)}, RootCAs: p.caPool, MinVersion: tls.VersionTLS13}
}

// Mutual TLS: the cluster forms over TLS, a trusted client works, a client
// without a certificate or with one from another CA is refused, and a
// replica with an untrusted certificate cannot take part.
func TestMutualTLS(t *testing.T) {
	good, evil := newPKI(t), newPKI(t)
	c := testcluster.New(t, testcluster.Options{Size: 3, Configure: func(cfg *quorumlock.Config) {
		ca := good
		if cfg.ID == 3 {
			ca = evil // replica 3 is a stranger
		}
		cfg.TLS, cfg.PeerTLS = ca.server(t, "replica"), ca.client(t, "replica")
	}})
	lead := c.WaitLeader(10 * time.Second)
	if lead == 3 {
		t.Fatal("the untrusted replica leads")
	}
	cl := dial(t, addrsOf(c, 1, 2), quorumlock.WithTLS(good.client(t, "app")))
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
		"no certificate": quorumlock.WithTLS(&tls.Config{RootCAs: good.caPool, MinVersion: tls.VersionTLS13}),
		"untrusted CA":   quorumlock.WithTLS(evil.client(t, "intruder")),
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
