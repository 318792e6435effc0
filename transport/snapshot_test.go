package transport_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/transport"
)

// snapMsg returns a MsgSnap from from to to of a snapshot at index with
// data, and a ConfState that must survive the transfer.
func snapMsg(from, to, index uint64, data []byte) *raftpb.Message {
	m := msg(from, to, index)
	m.Type = raftpb.MsgSnap.Enum()
	m.Snapshot = &raftpb.Snapshot{Data: data, Metadata: &raftpb.SnapshotMetadata{
		Index:     proto.Uint64(index),
		Term:      proto.Uint64(1),
		ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}},
	}}
	return m
}

// randomData returns n pseudo-random bytes.
func randomData(n int) []byte {
	var seed [32]byte
	seed[0] = byte(n)
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(seed).Read(b)
	return b
}

// receivedSnapshots returns the MsgSnaps that r received from member from.
func (r *recorder) receivedSnapshots(from uint64) []*raftpb.Message {
	var out []*raftpb.Message
	for _, m := range r.received(from) {
		if m.GetType() == raftpb.MsgSnap {
			out = append(out, m)
		}
	}
	return out
}

// lastStatus returns the latest SnapshotStatus reported to r for id and how
// many were reported.
func (r *recorder) lastStatus(id uint64) (raft.SnapshotStatus, int) {
	st := r.snapshotStatuses(id)
	if len(st) == 0 {
		return 0, 0
	}
	return st[len(st)-1], len(st)
}

// checkSnapshot fails unless got is want with its data intact.
func checkSnapshot(t *testing.T, got, want *raftpb.Message) {
	t.Helper()
	if got.GetType() != raftpb.MsgSnap || got.GetFrom() != want.GetFrom() || got.GetTo() != want.GetTo() {
		t.Fatalf("got %v from %d to %d, want MsgSnap from %d to %d",
			got.GetType(), got.GetFrom(), got.GetTo(), want.GetFrom(), want.GetTo())
	}
	if !proto.Equal(got.GetSnapshot().GetMetadata(), want.GetSnapshot().GetMetadata()) {
		t.Fatalf("metadata %v, want %v", got.GetSnapshot().GetMetadata(), want.GetSnapshot().GetMetadata())
	}
	if !bytes.Equal(got.GetSnapshot().GetData(), want.GetSnapshot().GetData()) {
		t.Fatalf("snapshot data differs: %d bytes, want %d", len(got.GetSnapshot().GetData()), len(want.GetSnapshot().GetData()))
	}
}

// chunkTap intercepts the Peer.Snapshot streams of the server it is
// installed on. It counts chunk numbers per stream from 1; at chunk
// corruptAt it flips a bit of the data, and at chunk stallAt the receiver
// stops reading until the stream ends (0: never).
type chunkTap struct {
	corruptAt, stallAt atomic.Int64
	stalled            chan struct{} // receives when a stream stalls
}

func newChunkTap() *chunkTap { return &chunkTap{stalled: make(chan struct{}, 16)} }

func (c *chunkTap) option() grpc.ServerOption {
	return grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if info.FullMethod != lockpb.Peer_Snapshot_FullMethodName {
			return h(srv, ss)
		}
		return h(srv, &tappedStream{ServerStream: ss, tap: c})
	})
}

type tappedStream struct {
	grpc.ServerStream
	tap *chunkTap
	n   int64 // chunks received; RecvMsg runs on one goroutine
}

func (s *tappedStream) RecvMsg(m any) error {
	s.n++
	if s.n == s.tap.stallAt.Load() {
		s.tap.stalled <- struct{}{}
		<-s.Context().Done()
		return s.Context().Err()
	}
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if c, ok := m.(*lockpb.SnapshotChunk); ok && s.n == s.tap.corruptAt.Load() && len(c.Data) > 0 {
		c.Data[len(c.Data)/2] ^= 0x10
	}
	return nil
}

// pair starts members 1 (a) and 2 (b) of cluster 1; mod, if set, adjusts
// each config, and b's server is built with opts.
func pair(t *testing.T, mod func(*transport.Config), opts ...grpc.ServerOption) (a, b *node) {
	t.Helper()
	la, lb := listen(t), listen(t)
	peers := map[uint64]string{1: la.Addr().String(), 2: lb.Addr().String()}
	cfg := func(id uint64) transport.Config {
		c := transport.Config{ClusterID: 1, ID: id, Peers: peers}
		if mod != nil {
			mod(&c)
		}
		return c
	}
	a = newNode(t, cfg(1), la)
	b = newNode(t, cfg(2), nil)
	b.addr = lb.Addr().String()
	b.serve(lb, opts...)
	return a, b
}

// A 20 MiB snapshot, five times the receiving server's default message size
// limit, arrives intact in 1 MiB chunks, and the sender reports
// SnapshotFinish; the message stream goes on meanwhile.
func TestSnapshotChunked(t *testing.T) {
	const size = 20 << 20
	a, b := pair(t, nil)
	data := randomData(size)
	orig := bytes.Clone(data)
	want := snapMsg(1, 2, 10, data)
	a.tr.Send([]*raftpb.Message{msg(1, 2, 1), want, msg(1, 2, 2)})

	waitFor(t, "the snapshot", func() bool { return len(b.rec.receivedSnapshots(1)) == 1 })
	checkSnapshot(t, b.rec.receivedSnapshots(1)[0], want)
	if !bytes.Equal(want.GetSnapshot().GetData(), orig) {
		t.Fatal("the sender's snapshot was modified")
	}
	waitFor(t, "SnapshotFinish", func() bool {
		st, n := a.rec.lastStatus(2)
		return n > 0 && st == raft.SnapshotFinish
	})
	if st := a.rec.snapshotStatuses(2); len(st) != 1 {
		t.Errorf("statuses %v, want one SnapshotFinish", st)
	}
	waitFor(t, "the other messages", func() bool { return len(b.rec.received(1)) == 3 })

	const chunks = 1 + size/(1<<20) // the header, then the data
	sa, sb := a.tr.Stats(), b.tr.Stats()
	if sa.SnapshotChunksSent != chunks || sb.SnapshotChunksReceived != chunks {
		t.Errorf("chunks sent %d, received %d; want %d", sa.SnapshotChunksSent, sb.SnapshotChunksReceived, chunks)
	}
	if sa.SnapshotsSent != 1 || sa.SnapshotsFailed != 0 || sa.Dropped != 0 || sb.SnapshotsReceived != 1 || sb.SnapshotsRejected != 0 {
		t.Errorf("sender %+v, receiver %+v: want one snapshot sent and received, nothing failed", sa, sb)
	}
	if sa.FramesSent != 1 && sa.FramesSent != 2 {
		t.Errorf("%d frames sent: the snapshot must not travel in a frame", sa.FramesSent)
	}
}

// A snapshot without data, like that of an empty state machine, is
// delivered too.
func TestSnapshotEmpty(t *testing.T) {
	a, b := pair(t, nil)
	want := snapMsg(1, 2, 5, nil)
	a.tr.Send([]*raftpb.Message{want})
	waitFor(t, "the snapshot", func() bool { return len(b.rec.receivedSnapshots(1)) == 1 })
	checkSnapshot(t, b.rec.receivedSnapshots(1)[0], want)
	waitFor(t, "SnapshotFinish", func() bool { st, n := a.rec.lastStatus(2); return n == 1 && st == raft.SnapshotFinish })
	if got := a.tr.Stats().SnapshotChunksSent; got != 1 {
		t.Errorf("%d chunks for an empty snapshot, want 1 (the header)", got)
	}
}

// A receiver that stops in the middle of a transfer makes the sender report
// SnapshotFailure without blocking Send; the next snapshot goes through.
func TestSnapshotReceiverStops(t *testing.T) {
	for _, tc := range []struct {
		name string
		// stop makes the stalled receiver b stop for good or for a while; it
		// returns a function that brings b back.
		stop func(t *testing.T, b *node) func()
	}{
		{"stops reading", func(*testing.T, *node) func() { return func() {} }},
		{"server stopped", func(t *testing.T, b *node) func() {
			b.stop()
			return func() { b.serve(listenAt(t, b.addr)) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tap := newChunkTap()
			tap.stallAt.Store(3)
			// A small receive window (it also turns off gRPC's window
			// growth) so that the stalled receiver holds the sender back at
			// once.
			a, b := pair(t, func(c *transport.Config) { c.SnapshotStallTimeout = 500 * time.Millisecond },
				tap.option(), grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))
			first := snapMsg(1, 2, 10, randomData(20<<20))
			a.tr.Send([]*raftpb.Message{first})
			select {
			case <-tap.stalled:
			case <-time.After(waitTimeout):
				t.Fatal("the transfer never reached the third chunk")
			}
			tap.stallAt.Store(0)
			restart := tc.stop(t, b)

			// Send does not block on the stalled transfer.
			done := make(chan struct{})
			go func() {
				defer close(done)
				a.tr.Send([]*raftpb.Message{msg(1, 2, 1)})
			}()
			select {
			case <-done:
			case <-time.After(waitTimeout):
				t.Fatal("Send blocked")
			}

			waitFor(t, "SnapshotFailure", func() bool { st, n := a.rec.lastStatus(2); return n == 1 && st == raft.SnapshotFailure })
			if got := a.tr.Stats(); got.SnapshotsFailed != 1 || got.SnapshotsSent != 0 {
				t.Fatalf("stats %+v: want one failed snapshot", got)
			}
			if n := len(b.rec.receivedSnapshots(1)); n != 0 {
				t.Fatalf("%d snapshots delivered from a failed transfer", n)
			}

			restart()
			second := snapMsg(1, 2, 11, randomData(3<<20))
			a.tr.Send([]*raftpb.Message{second})
			waitFor(t, "the next snapshot", func() bool { return len(b.rec.receivedSnapshots(1)) == 1 })
			checkSnapshot(t, b.rec.receivedSnapshots(1)[0], second)
			waitFor(t, "SnapshotFinish", func() bool { st, _ := a.rec.lastStatus(2); return st == raft.SnapshotFinish })
		})
	}
}

// listenAt listens on addr once it is free again.
func listenAt(t *testing.T, addr string) (lis net.Listener) {
	t.Helper()
	waitFor(t, "the address to be free again", func() bool {
		var err error
		lis, err = net.Listen("tcp", addr)
		return err == nil
	})
	return lis
}

// A chunk corrupted on the way fails the CRC check: the snapshot is not
// delivered, the receiver counts the rejection and the sender reports
// SnapshotFailure. The retransmitted snapshot arrives.
func TestSnapshotCorruptedChunk(t *testing.T) {
	tap := newChunkTap()
	tap.corruptAt.Store(5)
	a, b := pair(t, nil, tap.option())
	want := snapMsg(1, 2, 10, randomData(8<<20))
	a.tr.Send([]*raftpb.Message{want})
	waitFor(t, "SnapshotFailure", func() bool { st, n := a.rec.lastStatus(2); return n == 1 && st == raft.SnapshotFailure })
	if got := b.tr.Stats(); got.SnapshotsRejected != 1 || got.SnapshotsReceived != 0 || got.SnapshotChunksReceived != 9 {
		t.Fatalf("receiver stats %+v: want all 9 chunks received, the snapshot rejected and not delivered", got)
	}
	if n := len(b.rec.receivedSnapshots(1)); n != 0 {
		t.Fatalf("a corrupted snapshot was delivered")
	}

	tap.corruptAt.Store(0)
	a.tr.Send([]*raftpb.Message{want})
	waitFor(t, "the retransmitted snapshot", func() bool { return len(b.rec.receivedSnapshots(1)) == 1 })
	checkSnapshot(t, b.rec.receivedSnapshots(1)[0], want)
}

// A transport of another cluster, one claiming an unknown member ID, and one
// that thinks the replica is another member cannot deliver a snapshot; they
// report SnapshotFailure.
func TestSnapshotFromStranger(t *testing.T) {
	a, _ := pair(t, nil)
	for _, s := range []struct {
		name   string
		cfg    transport.Config
		target uint64
	}{
		{"other cluster", transport.Config{ClusterID: 2, ID: 2, Peers: map[uint64]string{1: a.addr, 2: "127.0.0.1:1"}}, 1},
		{"unknown member", transport.Config{ClusterID: 1, ID: 9, Peers: map[uint64]string{1: a.addr, 9: "127.0.0.1:1"}}, 1},
		{"wrong recipient", transport.Config{ClusterID: 1, ID: 2, Peers: map[uint64]string{3: a.addr, 2: "127.0.0.1:1"}}, 3},
	} {
		t.Run(s.name, func(t *testing.T) {
			n := newNode(t, s.cfg, nil)
			n.tr.Send([]*raftpb.Message{snapMsg(s.cfg.ID, s.target, 10, randomData(2<<20))})
			waitFor(t, "SnapshotFailure", func() bool { st, c := n.rec.lastStatus(s.target); return c == 1 && st == raft.SnapshotFailure })
			if st := n.tr.Stats(); st.SnapshotsSent != 0 || st.SnapshotsFailed != 1 || st.OutboundRejected == 0 {
				t.Errorf("stranger stats %+v: want the snapshot failed as rejected", st)
			}
		})
	}
	st := a.tr.Stats()
	if st.SnapshotChunksReceived != 0 || st.SnapshotsReceived != 0 || st.InboundRejected < 3 {
		t.Errorf("replica stats %+v: want no chunk accepted and the handshakes rejected", st)
	}
	if len(a.rec.all()) != 0 {
		t.Fatalf("a stranger's message reached Handler: %v", a.rec.all())
	}
}

// A snapshot larger than the receiver's MaxSnapshotBytes is refused at its
// header; one of exactly the limit is accepted.
func TestSnapshotOversize(t *testing.T) {
	const limit = 4 << 20
	a, b := pair(t, func(c *transport.Config) {
		if c.ID == 2 {
			c.MaxSnapshotBytes = limit
		}
	})
	a.tr.Send([]*raftpb.Message{snapMsg(1, 2, 10, randomData(limit+1))})
	waitFor(t, "SnapshotFailure", func() bool { st, n := a.rec.lastStatus(2); return n == 1 && st == raft.SnapshotFailure })
	if got := b.tr.Stats(); got.SnapshotsRejected != 1 || got.SnapshotChunksReceived != 1 || got.SnapshotsReceived != 0 {
		t.Fatalf("receiver stats %+v: want the snapshot rejected at its header", got)
	}

	want := snapMsg(1, 2, 11, randomData(limit))
	a.tr.Send([]*raftpb.Message{want})
	waitFor(t, "the snapshot at the limit", func() bool { return len(b.rec.receivedSnapshots(1)) == 1 })
	checkSnapshot(t, b.rec.receivedSnapshots(1)[0], want)
}

// While a transfer runs, a newer MsgSnap replaces one that waits; the
// replaced one is never sent.
func TestSnapshotSupersedesWaiting(t *testing.T) {
	d := newGatedDialer(false)
	a, b := pair(t, func(c *transport.Config) {
		if c.ID == 1 {
			c.Dialer = d.dial
		}
	})
	a.tr.Send([]*raftpb.Message{snapMsg(1, 2, 3, randomData(1<<10))})
	// One dial for the message stream, one for the transfer of snapshot 3.
	waitFor(t, "the transfer to start", func() bool { return d.dials.Load() >= 2 })
	a.tr.Send([]*raftpb.Message{snapMsg(1, 2, 4, randomData(1<<10))})
	a.tr.Send([]*raftpb.Message{snapMsg(1, 2, 5, randomData(1<<10))})
	if got := a.tr.Stats().Dropped; got != 1 {
		t.Fatalf("Dropped = %d, want 1 (snapshot 4)", got)
	}
	close(d.open)

	waitFor(t, "two snapshots", func() bool { return len(b.rec.receivedSnapshots(1)) == 2 })
	var got []uint64
	for _, m := range b.rec.receivedSnapshots(1) {
		got = append(got, m.GetSnapshot().GetMetadata().GetIndex())
	}
	if !slices.Equal(got, []uint64{3, 5}) {
		t.Fatalf("received snapshots %v, want [3 5]", got)
	}
	waitFor(t, "SnapshotFinish", func() bool {
		st, n := a.rec.lastStatus(2)
		return a.tr.Stats().SnapshotsSent == 2 && n > 0 && st == raft.SnapshotFinish
	})
	if slices.Contains(a.rec.snapshotStatuses(2), raft.SnapshotFailure) {
		t.Fatalf("statuses %v: the replaced snapshot must not be reported", a.rec.snapshotStatuses(2))
	}
}

// Close in the middle of a transfer returns promptly, reports nothing, and
// leaves no goroutine behind (checked by TestMain); the receiver's end of the
// transfer ends too.
func TestSnapshotCloseMidTransfer(t *testing.T) {
	tap := newChunkTap()
	tap.stallAt.Store(3)
	a, b := pair(t, nil, tap.option(), grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))
	a.tr.Send([]*raftpb.Message{snapMsg(1, 2, 10, randomData(8<<20))})
	select {
	case <-tap.stalled:
	case <-time.After(waitTimeout):
		t.Fatal("the transfer never reached the third chunk")
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		a.tr.Close()
		b.tr.Close()
	}()
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("Close did not return")
	}
	if st := a.rec.snapshotStatuses(2); len(st) != 0 {
		t.Fatalf("statuses %v reported for a transfer ended by Close", st)
	}
}
