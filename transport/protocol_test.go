package transport_test

import (
	"context"
	"hash/crc32"
	"sync"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/transport"
)

// rawStream opens a Peer stream to addr without a Transport, so a test can
// speak the protocol wrongly.
func rawStream(t *testing.T, addr string) lockpb.Peer_StreamClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(func() {
		cancel()
		cc.Close()
	})
	s, err := lockpb.NewPeerClient(cc).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func marshal(t *testing.T, m *raftpb.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// handshake sends a valid Hello from member 2 to member 1 of cluster 1,
// with msgs attached, and checks the answer.
func handshake(t *testing.T, s lockpb.Peer_StreamClient, msgs ...[]byte) {
	t.Helper()
	if err := s.Send(&lockpb.PeerFrame{Hello: &lockpb.Hello{ClusterId: 1, From: 2, To: 1}, Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	f, err := s.Recv()
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	if h := f.GetHello(); h.GetClusterId() != 1 || h.GetFrom() != 1 || h.GetTo() != 2 {
		t.Fatalf("answer %v, want Hello{1, from 1, to 2}", h)
	}
}

// expectEnd waits for the end of s and checks its status code.
func expectEnd(t *testing.T, s lockpb.Peer_StreamClient, want codes.Code) {
	t.Helper()
	for {
		_, err := s.Recv()
		if err == nil {
			continue
		}
		if got := status.Code(err); got != want {
			t.Fatalf("stream ended with %v, want %v", err, want)
		}
		return
	}
}

// Protocol violations close the stream with an error, never panic, and
// deliver nothing that came before a successful handshake or after the
// violation.
func TestServerRejectsBadFrames(t *testing.T) {
	const marker = 666
	// Member 2 exists but runs no transport, so only the test's raw streams
	// claim to be it.
	lis := listen(t)
	a := newNode(t, transport.Config{ClusterID: 1, ID: 1, Peers: map[uint64]string{1: lis.Addr().String(), 2: "127.0.0.1:1"}}, lis)
	stray := marshal(t, msg(2, 1, marker))

	t.Run("no hello", func(t *testing.T) {
		s := rawStream(t, a.addr)
		if err := s.Send(&lockpb.PeerFrame{Messages: [][]byte{stray}}); err != nil {
			t.Fatal(err)
		}
		expectEnd(t, s, codes.InvalidArgument)
	})
	t.Run("messages with the hello are ignored; garbage closes", func(t *testing.T) {
		s := rawStream(t, a.addr)
		handshake(t, s, stray)
		if err := s.Send(&lockpb.PeerFrame{Messages: [][]byte{{0xff, 0xff, 0xff}}}); err != nil {
			t.Fatal(err)
		}
		expectEnd(t, s, codes.InvalidArgument)
	})
	t.Run("message from another member", func(t *testing.T) {
		s := rawStream(t, a.addr)
		handshake(t, s)
		if err := s.Send(&lockpb.PeerFrame{Messages: [][]byte{marshal(t, msg(3, 1, marker))}}); err != nil {
			t.Fatal(err)
		}
		expectEnd(t, s, codes.InvalidArgument)
	})
	t.Run("second hello", func(t *testing.T) {
		s := rawStream(t, a.addr)
		handshake(t, s)
		if err := s.Send(&lockpb.PeerFrame{Messages: [][]byte{marshal(t, msg(2, 1, 1))}}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "a valid message", func() bool { return len(a.rec.received(2)) > 0 })
		if err := s.Send(&lockpb.PeerFrame{Hello: &lockpb.Hello{ClusterId: 1, From: 2, To: 1}}); err != nil {
			t.Fatal(err)
		}
		expectEnd(t, s, codes.InvalidArgument)
	})
	t.Run("newer stream supersedes", func(t *testing.T) {
		s1 := rawStream(t, a.addr)
		handshake(t, s1)
		s2 := rawStream(t, a.addr)
		handshake(t, s2)
		expectEnd(t, s1, codes.Aborted)
		if err := s2.Send(&lockpb.PeerFrame{Messages: [][]byte{marshal(t, msg(2, 1, 2))}}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "delivery on the newer stream", func() bool { return len(a.rec.received(2)) >= 2 })
	})

	for _, m := range a.rec.all() {
		if m.GetIndex() == marker {
			t.Fatalf("a message outside a valid handshake reached Handler: %v", m)
		}
	}
	if got := a.tr.Stats().InboundRejected; got != 1 {
		t.Errorf("InboundRejected = %d, want 1 (the stream without hello)", got)
	}
}

// fakePeer answers every handshake with a fixed Hello and records the
// messages it receives afterwards.
type fakePeer struct {
	lockpb.UnimplementedPeerServer
	answer *lockpb.Hello

	mu       sync.Mutex
	messages int
}

func (f *fakePeer) Stream(s lockpb.Peer_StreamServer) error {
	if _, err := s.Recv(); err != nil {
		return err
	}
	if err := s.Send(&lockpb.PeerFrame{Hello: f.answer}); err != nil {
		return err
	}
	for {
		fr, err := s.Recv()
		if err != nil {
			return err
		}
		f.mu.Lock()
		f.messages += len(fr.GetMessages())
		f.mu.Unlock()
	}
}

// The sender refuses a stream answered by another member or cluster than the
// one it dialed, and sends nothing on it.
func TestClientVerifiesAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer *lockpb.Hello
	}{
		{"other member", &lockpb.Hello{ClusterId: 1, From: 5, To: 1}},
		{"other cluster", &lockpb.Hello{ClusterId: 7, From: 2, To: 1}},
		{"other recipient", &lockpb.Hello{ClusterId: 1, From: 2, To: 4}},
		{"no hello", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis := listen(t)
			fake := &fakePeer{answer: tc.answer}
			srv := grpc.NewServer()
			lockpb.RegisterPeerServer(srv, fake)
			go func() { _ = srv.Serve(lis) }()
			defer srv.Stop()

			a := newNode(t, transport.Config{ClusterID: 1, ID: 1, Peers: map[uint64]string{1: "", 2: lis.Addr().String()}}, nil)
			sendUntil(t, a.tr, msg(1, 2, 1), "the rejection", func() bool {
				return a.tr.Stats().OutboundRejected > 0 && a.rec.unreachableCount(2) > 0
			})
			a.tr.Close()
			fake.mu.Lock()
			defer fake.mu.Unlock()
			if fake.messages != 0 || a.tr.Stats().MessagesSent != 0 {
				t.Fatalf("%d messages reached a peer that answered as %v", fake.messages, tc.answer)
			}
		})
	}
}

// sendSnapshotChunks opens a Peer.Snapshot stream to addr without a
// Transport, sends chunks and returns the outcome.
func sendSnapshotChunks(t *testing.T, addr string, chunks ...*lockpb.SnapshotChunk) (*lockpb.SnapshotAck, error) {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	s, err := lockpb.NewPeerClient(cc).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range chunks {
		if err := s.Send(c); err != nil {
			break // the receiver ended the stream; CloseAndRecv says why
		}
	}
	return s.CloseAndRecv()
}

// Every violation of the snapshot protocol ends the transfer with the code
// doc.go names, and nothing of it reaches Handler; a valid transfer is
// acknowledged with the receiver's Hello.
func TestSnapshotProtocol(t *testing.T) {
	const marker = 666
	lis := listen(t)
	a := newNode(t, transport.Config{ClusterID: 1, ID: 1, Peers: map[uint64]string{1: lis.Addr().String(), 2: "127.0.0.1:1"},
		MaxSnapshotBytes: 1 << 10}, lis)
	hello := &lockpb.Hello{ClusterId: 1, From: 2, To: 1}
	snap := func(from uint64, data []byte) []byte {
		m := msg(from, 1, marker)
		m.Type = raftpb.MsgSnap.Enum()
		m.Snapshot = &raftpb.Snapshot{Data: data, Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(7), Term: proto.Uint64(1)}}
		return marshal(t, m)
	}
	data := []byte("lock table")
	sum := crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli))
	header := func(total uint64, crc uint32) *lockpb.SnapshotChunk {
		return &lockpb.SnapshotChunk{Hello: hello, Message: snap(2, nil), Total: total, Crc32C: crc}
	}
	chunk := func(off uint64, d []byte) *lockpb.SnapshotChunk { return &lockpb.SnapshotChunk{Offset: off, Data: d} }

	for _, tc := range []struct {
		name     string
		chunks   []*lockpb.SnapshotChunk
		want     codes.Code
		rejected bool // counted in SnapshotsRejected (after the handshake)
	}{
		{"no hello", []*lockpb.SnapshotChunk{{Message: snap(2, nil), Total: 1}, chunk(0, data)}, codes.InvalidArgument, false},
		{"other cluster", []*lockpb.SnapshotChunk{{Hello: &lockpb.Hello{ClusterId: 7, From: 2, To: 1}, Message: snap(2, nil)}}, codes.FailedPrecondition, false},
		{"unknown member", []*lockpb.SnapshotChunk{{Hello: &lockpb.Hello{ClusterId: 1, From: 9, To: 1}, Message: snap(9, nil)}}, codes.PermissionDenied, false},
		{"not a MsgSnap", []*lockpb.SnapshotChunk{{Hello: hello, Message: marshal(t, msg(2, 1, marker))}}, codes.InvalidArgument, true},
		{"message from another member", []*lockpb.SnapshotChunk{{Hello: hello, Message: snap(3, nil)}}, codes.InvalidArgument, true},
		{"data in the header", []*lockpb.SnapshotChunk{{Hello: hello, Message: snap(2, data), Total: 0}}, codes.InvalidArgument, true},
		{"data in the first chunk", []*lockpb.SnapshotChunk{{Hello: hello, Message: snap(2, nil), Total: uint64(len(data)), Data: data}}, codes.InvalidArgument, true},
		{"over the limit", []*lockpb.SnapshotChunk{header(1<<10+1, sum)}, codes.ResourceExhausted, true},
		{"gap", []*lockpb.SnapshotChunk{header(uint64(len(data)), sum), chunk(0, data[:3]), chunk(4, data[4:])}, codes.InvalidArgument, true},
		{"past the total", []*lockpb.SnapshotChunk{header(3, sum), chunk(0, data)}, codes.InvalidArgument, true},
		{"second header", []*lockpb.SnapshotChunk{header(uint64(len(data)), sum), header(uint64(len(data)), sum)}, codes.InvalidArgument, true},
		{"incomplete", []*lockpb.SnapshotChunk{header(uint64(len(data)), sum), chunk(0, data[:3])}, codes.InvalidArgument, true},
		{"bad CRC", []*lockpb.SnapshotChunk{header(uint64(len(data)), sum^1), chunk(0, data[:3]), chunk(3, data[3:])}, codes.DataLoss, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := a.tr.Stats().SnapshotsRejected
			_, err := sendSnapshotChunks(t, a.addr, tc.chunks...)
			if got := status.Code(err); got != tc.want {
				t.Fatalf("transfer ended with %v, want %v", err, tc.want)
			}
			if got := a.tr.Stats().SnapshotsRejected - before; tc.rejected != (got == 1) {
				t.Errorf("SnapshotsRejected went up by %d (counted after the handshake: %v)", got, tc.rejected)
			}
		})
	}
	if n := len(a.rec.all()); n != 0 {
		t.Fatalf("%d messages of refused transfers reached Handler", n)
	}

	ack, err := sendSnapshotChunks(t, a.addr, header(uint64(len(data)), sum), chunk(0, data[:4]), chunk(4, data[4:]))
	if err != nil {
		t.Fatalf("valid transfer: %v", err)
	}
	if h := ack.GetHello(); h.GetClusterId() != 1 || h.GetFrom() != 1 || h.GetTo() != 2 {
		t.Fatalf("ack %v, want Hello{1, from 1, to 2}", h)
	}
	got := a.rec.all()
	if len(got) != 1 || got[0].GetType() != raftpb.MsgSnap || string(got[0].GetSnapshot().GetData()) != string(data) {
		t.Fatalf("delivered %v, want the MsgSnap with its data", got)
	}
}
