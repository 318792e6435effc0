package quorumlock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
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
	ca := NewTestCA(t, "cluster CA")
	// The peer side pins the CA itself instead of using RootCAs.
	verify := func(raw [][]byte, _ [][]*x509.Certificate) error {
		c, err := x509.ParseCertificate(raw[0])
		if err != nil {
			return err
		}
		return c.CheckSignatureFrom(ca.Cert)
	}
	_, cfg := startPeerAuthReplica(t,
		&tls.Config{Certificates: []tls.Certificate{ca.Leaf(t, "replica 1")}, ClientAuth: tls.RequireAndVerifyClientCert,
			ClientCAs: ca.Pool, MinVersion: tls.VersionTLS13},
		&tls.Config{Certificates: []tls.Certificate{ca.Leaf(t, "replica 1")}, InsecureSkipVerify: true,
			VerifyPeerCertificate: verify, MinVersion: tls.VersionTLS13})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Replica 2 dials as its PeerTLS would.
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{ca.Leaf(t, "replica 2")}, InsecureSkipVerify: true,
		VerifyPeerCertificate: verify, MinVersion: tls.VersionTLS13})
	if _, err := openPeerStream(t, ctx, cfg, creds); err != nil {
		t.Fatalf("replica 2, with a certificate the port verifies, could not open a peer stream: %v", err)
	}
}

// TestPeerStreamWithSeparateServerAndClientCAs: a PKI with one CA for
// server certificates (which PeerTLS.RootCAs trusts) and another for
// client certificates (ClientCAs), which every replica's client
// certificate comes from as the applications' do, worked before peer
// streams were authorized. Checking a peer stream's client certificate
// against PeerTLS.RootCAs, the servers' CA, refused every peer.
func TestPeerStreamWithSeparateServerAndClientCAs(t *testing.T) {
	serverCA, clientCA := NewTestCA(t, "server CA"), NewTestCA(t, "client CA")
	_, cfg := startPeerAuthReplica(t,
		&tls.Config{Certificates: []tls.Certificate{serverCA.Leaf(t, "replica 1")}, ClientAuth: tls.RequireAndVerifyClientCert,
			ClientCAs: clientCA.Pool, MinVersion: tls.VersionTLS13},
		&tls.Config{Certificates: []tls.Certificate{clientCA.Leaf(t, "replica 1 client")}, RootCAs: serverCA.Pool,
			MinVersion: tls.VersionTLS13})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Replica 2 dials as its PeerTLS would.
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{clientCA.Leaf(t, "replica 2 client")}, RootCAs: serverCA.Pool,
		MinVersion: tls.VersionTLS13})
	if _, err := openPeerStream(t, ctx, cfg, creds); err != nil {
		t.Fatalf("replica 2, with a client certificate the port verifies, could not open a peer stream: %v", err)
	}
}

// TestForgedPeerMessageStopsReplicaNotProcess: end to end, a peer stream
// (no TLS: the Hello is believed) carrying a heartbeat whose commit index
// is past the log stops the replica (Done closes, Err wraps
// raftnode.ErrBadMessage) instead of panicking
// the process.
func TestForgedPeerMessageStopsReplicaNotProcess(t *testing.T) {
	n, cfg := startPeerAuthReplica(t, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := openPeerStream(t, ctx, cfg, insecure.NewCredentials())
	if err != nil {
		t.Fatalf("peer stream refused: %v", err)
	}
	m, err := proto.Marshal(&raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: new(uint64(2)), To: new(uint64(1)),
		Term: new(uint64(5)), Commit: new(uint64(1000))})
	if err != nil {
		t.Fatal(err)
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
