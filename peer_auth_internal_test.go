package quorumlock

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// TestCA is a throwaway certificate authority whose leaf certificates
// serve 127.0.0.1 as server and client. It is exported for the package's
// external tests (TestMutualTLS); internal/proctest has the file-based
// equivalent for processes.
type TestCA struct {
	Cert *x509.Certificate
	Pool *x509.CertPool // holds Cert
	key  *ecdsa.PrivateKey
}

// NewTestCA creates a CA valid for an hour.
func NewTestCA(t testing.TB, name string) *TestCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &TestCA{Cert: cert, Pool: pool, key: key}
}

// Leaf issues a certificate for 127.0.0.1 with both the server and client
// extended key usages.
func (ca *TestCA) Leaf(t testing.TB, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// ServerTLS is a replica's Config.TLS: a new leaf, client certificates
// required and verified against this CA.
func (ca *TestCA) ServerTLS(t testing.TB, name string) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{ca.Leaf(t, name)}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool, MinVersion: tls.VersionTLS13}
}

// ClientTLS is a client's (or a replica's PeerTLS): a new leaf, servers
// verified against this CA.
func (ca *TestCA) ClientTLS(t testing.TB, name string) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{ca.Leaf(t, name)}, RootCAs: ca.Pool, MinVersion: tls.VersionTLS13}
}

// startPeerAuthReplica starts replica 1 of a cluster whose other members
// (IDs 2 and 3) never run, on loopback with the given TLS sides (nil:
// plaintext), closed when the test ends. It returns the replica and its
// Config, whose cluster ID a forged Hello needs.
func startPeerAuthReplica(t *testing.T, serverTLS, peerTLS *tls.Config) (*Node, Config) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		ID: 1, Peers: map[uint64]string{1: lis.Addr().String(), 2: "127.0.0.1:1", 3: "127.0.0.1:2"}, DataDir: t.TempDir(), Listener: lis,
		TickInterval: 10 * time.Millisecond, ClusterName: "peer-auth-test", TLS: serverTLS, PeerTLS: peerTLS,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, cfg
}

// openPeerStream connects to cfg's replica with creds, opens a peer stream
// and sends member 2's Hello. It returns the stream and the error of the
// answer (nil: accepted); an answer that is not replica 1's Hello fails
// the test.
func openPeerStream(t *testing.T, ctx context.Context, cfg Config, creds credentials.TransportCredentials) (lockpb.Peer_StreamClient, error) {
	t.Helper()
	conn, err := grpc.NewClient(cfg.Listener.Addr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	st, err := lockpb.NewPeerClient(conn).Stream(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&lockpb.PeerFrame{Hello: &lockpb.Hello{ClusterId: cfg.clusterID(), From: 2, To: 1}}); err != nil {
		return nil, err
	}
	answer, err := st.Recv()
	if err == nil && answer.GetHello().GetFrom() != 1 {
		t.Fatalf("peer stream answered %v", answer)
	}
	return st, err
}

// TestPeerStreamNeedsPeerCertificate: with mutual TLS, a separate peer CA
// and a client CA that the replica's port both trusts, a process holding a
// client certificate can use the client API but cannot open a peer stream
// claiming a member's ID (it could otherwise send raft messages as that
// member); a certificate from the peer CA can.
func TestPeerStreamNeedsPeerCertificate(t *testing.T) {
	peerCA, clientCA := NewTestCA(t, "peer CA"), NewTestCA(t, "client CA")
	trusted := x509.NewCertPool()
	trusted.AddCert(peerCA.Cert)
	trusted.AddCert(clientCA.Cert)
	_, cfg := startPeerAuthReplica(t,
		&tls.Config{Certificates: []tls.Certificate{peerCA.Leaf(t, "replica 1")}, ClientAuth: tls.RequireAndVerifyClientCert,
			ClientCAs: trusted, MinVersion: tls.VersionTLS13},
		peerCA.ClientTLS(t, "replica 1"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	creds := func(ca *TestCA, name string) credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{ca.Leaf(t, name)}, RootCAs: peerCA.Pool, MinVersion: tls.VersionTLS13})
	}

	app, err := grpc.NewClient(cfg.Listener.Addr().String(), grpc.WithTransportCredentials(creds(clientCA, "app")))
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if _, err := lockpb.NewLockClient(app).Status(ctx, &lockpb.StatusRequest{}); err != nil {
		t.Fatalf("a client certificate from the client CA cannot reach the client API: %v", err)
	}
	if _, err := openPeerStream(t, ctx, cfg, creds(clientCA, "app")); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a client certificate opened a peer stream as member 2: %v; want PermissionDenied", err)
	}
	if _, err := openPeerStream(t, ctx, cfg, creds(peerCA, "replica 2")); err != nil {
		t.Fatalf("a peer certificate could not open a peer stream: %v", err)
	}
}
