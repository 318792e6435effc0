package transport_test

// Review P: mutation testing of the peer handshake and frame checks. Each
// test kills a mutation that the earlier tests let through.

import (
	"errors"
	"io"
	"strings"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/transport"
)

// A message on member 2's stream to member 1 that is addressed to member 3
// (a forged or misrouted recipient) closes the stream and is not delivered:
// decode checks To as well as From.
func TestReviewPMessageForAnotherRecipientCloses(t *testing.T) {
	const marker = 777
	lis := listen(t)
	a := newNode(t, transport.Config{ClusterID: 1, ID: 1, Peers: map[uint64]string{1: lis.Addr().String(), 2: "127.0.0.1:1", 3: "127.0.0.1:2"}}, lis)
	s := rawStream(t, a.addr)
	handshake(t, s)
	if err := s.Send(&lockpb.PeerFrame{Messages: [][]byte{marshal(t, msg(2, 3, marker))}}); err != nil {
		t.Fatal(err)
	}
	expectEnd(t, s, codes.InvalidArgument)
	for _, m := range a.rec.all() {
		if m.GetIndex() == marker {
			t.Fatalf("a message for member 3 reached member 1's Handler: %v", m)
		}
	}
}

// snapAckPeer accepts every snapshot transfer and acknowledges it with a
// fixed Hello; its message stream answers the handshake correctly.
type snapAckPeer struct {
	fakePeer
	ack *lockpb.Hello
}

func (f *snapAckPeer) Snapshot(s lockpb.Peer_SnapshotServer) error {
	for {
		if _, err := s.Recv(); err == io.EOF {
			break
		} else if err != nil {
			return err
		}
	}
	return s.SendAndClose(&lockpb.SnapshotAck{Hello: f.ack})
}

// The sender of a snapshot checks the acknowledgement: one from another
// cluster, another member, or for another recipient (or none) reports
// SnapshotFailure, counted as rejected, never as sent.
func TestReviewPSnapshotAckVerified(t *testing.T) {
	for _, tc := range []struct {
		name string
		ack  *lockpb.Hello
	}{
		{"other cluster", &lockpb.Hello{ClusterId: 7, From: 2, To: 1}},
		{"other member", &lockpb.Hello{ClusterId: 1, From: 5, To: 1}},
		{"other recipient", &lockpb.Hello{ClusterId: 1, From: 2, To: 4}},
		{"no hello", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis := listen(t)
			fake := &snapAckPeer{fakePeer: fakePeer{answer: &lockpb.Hello{ClusterId: 1, From: 2, To: 1}}, ack: tc.ack}
			srv := grpc.NewServer()
			lockpb.RegisterPeerServer(srv, fake)
			go func() { _ = srv.Serve(lis) }()
			defer srv.Stop()

			n := newNode(t, transport.Config{ClusterID: 1, ID: 1, Peers: map[uint64]string{1: "", 2: lis.Addr().String()}}, nil)
			n.tr.Send([]*raftpb.Message{snapMsg(1, 2, 10, randomData(1<<10))})
			waitFor(t, "a snapshot status", func() bool { _, c := n.rec.lastStatus(2); return c == 1 })
			if st, _ := n.rec.lastStatus(2); st != raft.SnapshotFailure {
				t.Fatalf("snapshot acknowledged as %v reported %v, want SnapshotFailure", tc.ack, st)
			}
			if st := n.tr.Stats(); st.SnapshotsSent != 0 || st.SnapshotsFailed != 1 || st.OutboundRejected == 0 {
				t.Errorf("stats %+v: want the snapshot failed as rejected", st)
			}
		})
	}
}

// New refuses each bad field with ErrInvalidConfig naming that field (ID 0
// by the ID check, not only because Peers lacks it).
func TestReviewPNewNamesTheField(t *testing.T) {
	h := func(*raftpb.Message) {}
	peers := map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1:2"}
	for _, tc := range []struct {
		want string
		cfg  transport.Config
	}{
		{"ID is 0", transport.Config{ClusterID: 1, Peers: map[uint64]string{0: "", 2: "127.0.0.1:2"}, Handler: h}},
		{"MaxSnapshotBytes", transport.Config{ClusterID: 1, ID: 1, Peers: peers, Handler: h, MaxSnapshotBytes: -1}},
		{"SnapshotStallTimeout", transport.Config{ClusterID: 1, ID: 1, Peers: peers, Handler: h, SnapshotStallTimeout: -1}},
	} {
		t.Run(tc.want, func(t *testing.T) {
			tr, err := transport.New(tc.cfg)
			if !errors.Is(err, transport.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				if tr != nil {
					tr.Close()
				}
				t.Fatalf("New: %v, want ErrInvalidConfig naming %s", err, tc.want)
			}
		})
	}
}
