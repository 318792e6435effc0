package quorumlock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/raftnode"
)

// TestPeerStreamWithPeerTLSSkippingRootCAs: a mutual-TLS setup whose peer
// side does not verify servers through RootCAs (InsecureSkipVerify with its
// own VerifyPeerCertificate, as SPIFFE-style configurations do; RootCAs is
// nil) worked before peer streams were authorized: the server's
// ClientCAs check was the peers' authentication. Checking a peer stream's
// certificate against PeerTLS.RootCAs (nil: the system roots) then refused
// every peer, so such a cluster never elected a leader.
func TestPeerStreamWithPeerTLSSkippingRootCAs(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// The peer side pins the CA itself instead of using RootCAs.
	verify := func(raw [][]byte, _ [][]*x509.Certificate) error {
		c, err := x509.ParseCertificate(raw[0])
		if err != nil {
			return err
		}
		return c.CheckSignatureFrom(ca.cert)
	}
	cfg := Config{
		ID: 1, Peers: map[uint64]string{1: lis.Addr().String(), 2: "127.0.0.1:1"}, DataDir: t.TempDir(), Listener: lis,
		TickInterval: 10 * time.Millisecond, ClusterName: "auth-test-e",
		TLS: &tls.Config{Certificates: []tls.Certificate{ca.leaf(t, "replica 1")}, ClientAuth: tls.RequireAndVerifyClientCert,
			ClientCAs: ca.pool, MinVersion: tls.VersionTLS13},
		PeerTLS: &tls.Config{Certificates: []tls.Certificate{ca.leaf(t, "replica 1")}, InsecureSkipVerify: true,
			VerifyPeerCertificate: verify, MinVersion: tls.VersionTLS13},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()

	// Replica 2 dials as its PeerTLS would.
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{ca.leaf(t, "replica 2")}, InsecureSkipVerify: true,
		VerifyPeerCertificate: verify, MinVersion: tls.VersionTLS13})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := lockpb.NewPeerClient(conn).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&lockpb.PeerFrame{Hello: &lockpb.Hello{ClusterId: cfg.clusterID(), From: 2, To: 1}}); err != nil {
		t.Fatal(err)
	}
	answer, err := st.Recv()
	if err != nil {
		t.Fatalf("replica 2, with a certificate the port verifies, could not open a peer stream: %v", err)
	}
	if answer.GetHello().GetFrom() != 1 {
		t.Fatalf("peer stream answered %v", answer)
	}
}

// TestPeerStreamWithSeparateServerAndClientCAs: a PKI with one CA for
// server certificates (which PeerTLS.RootCAs trusts) and another for
// client certificates (ClientCAs), which every replica's client
// certificate comes from as the applications' do, worked before peer
// streams were authorized. Checking a peer stream's client certificate
// against PeerTLS.RootCAs, the servers' CA, refused every peer.
func TestPeerStreamWithSeparateServerAndClientCAs(t *testing.T) {
	serverCA, clientCA := newTestCA(t, "server CA"), newTestCA(t, "client CA")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		ID: 1, Peers: map[uint64]string{1: lis.Addr().String(), 2: "127.0.0.1:1"}, DataDir: t.TempDir(), Listener: lis,
		TickInterval: 10 * time.Millisecond, ClusterName: "auth-test-e2",
		TLS: &tls.Config{Certificates: []tls.Certificate{serverCA.leaf(t, "replica 1")}, ClientAuth: tls.RequireAndVerifyClientCert,
			ClientCAs: clientCA.pool, MinVersion: tls.VersionTLS13},
		PeerTLS: &tls.Config{Certificates: []tls.Certificate{clientCA.leaf(t, "replica 1 client")}, RootCAs: serverCA.pool,
			MinVersion: tls.VersionTLS13},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()

	// Replica 2 dials as its PeerTLS would.
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{clientCA.leaf(t, "replica 2 client")}, RootCAs: serverCA.pool,
		MinVersion: tls.VersionTLS13})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := lockpb.NewPeerClient(conn).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&lockpb.PeerFrame{Hello: &lockpb.Hello{ClusterId: cfg.clusterID(), From: 2, To: 1}}); err != nil {
		t.Fatal(err)
	}
	answer, err := st.Recv()
	if err != nil {
		t.Fatalf("replica 2, with a client certificate the port verifies, could not open a peer stream: %v", err)
	}
	if answer.GetHello().GetFrom() != 1 {
		t.Fatalf("peer stream answered %v", answer)
	}
}

// TestForgedPeerMessageStopsReplicaNotProcess: end to end, a peer stream
// (no TLS: the Hello is believed) carrying a heartbeat whose commit index
// is past the log stops the replica (Done closes, Err wraps
// raftnode.ErrBadMessage) instead of panicking
// the process.
func TestForgedPeerMessageStopsReplicaNotProcess(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		ID: 1, Peers: map[uint64]string{1: lis.Addr().String(), 2: "127.0.0.1:1", 3: "127.0.0.1:2"}, DataDir: t.TempDir(), Listener: lis,
		TickInterval: 10 * time.Millisecond, ClusterName: "forged-e",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := lockpb.NewPeerClient(conn).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := proto.Marshal(&raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: new(uint64(2)), To: new(uint64(1)),
		Term: new(uint64(5)), Commit: new(uint64(1000))})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&lockpb.PeerFrame{Hello: &lockpb.Hello{ClusterId: cfg.clusterID(), From: 2, To: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatalf("peer stream refused: %v", err)
	}
	if err := st.Send(&lockpb.PeerFrame{Messages: [][]byte{m}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.Done():
	case <-ctx.Done():
		t.Fatal("the replica did not stop on the forged heartbeat")
	}
	if err := n.Err(); !errors.Is(err, raftnode.ErrBadMessage) {
		t.Fatalf("Err() = %v; want raftnode.ErrBadMessage", err)
	}
	// (Close returns nil now: the replica's own HardClose, from OnFatal,
	// was the first call. Err is what reports the failure.)
}
