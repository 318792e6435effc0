package transport_test

import (
	"context"
	"errors"
	"hash/crc32"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/transport"
)

// connKiller dials TCP and remembers the connections so that a test can
// break them (as a crashed peer or a reset link would); while fail is set it
// refuses to dial.
type connKiller struct {
	mu    sync.Mutex
	conns []net.Conn
	dials atomic.Int64
	fail  atomic.Bool
}

func (k *connKiller) dial(ctx context.Context, addr string) (net.Conn, error) {
	k.dials.Add(1)
	if k.fail.Load() {
		return nil, errors.New("injected dial failure")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		k.mu.Lock()
		k.conns = append(k.conns, c)
		k.mu.Unlock()
	}
	return c, err
}

func (k *connKiller) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.conns)
}

// kill closes the connections dialed so far with index in [from, to).
func (k *connKiller) kill(from, to int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range k.conns[from:to] {
		c.Close()
	}
}

// pauseTap holds the receiver of a Peer.Snapshot stream before its chunk
// number pauseAt (counted from 1) until release is closed or the stream ends.
type pauseTap struct {
	pauseAt atomic.Int64
	paused  chan struct{}
	release chan struct{}
}

func newPauseTap(at int64) *pauseTap {
	p := &pauseTap{paused: make(chan struct{}, 16), release: make(chan struct{})}
	p.pauseAt.Store(at)
	return p
}

func (p *pauseTap) option() grpc.ServerOption {
	return grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if info.FullMethod != lockpb.Peer_Snapshot_FullMethodName {
			return h(srv, ss)
		}
		return h(srv, &pausedStream{ServerStream: ss, tap: p})
	})
}

type pausedStream struct {
	grpc.ServerStream
	tap *pauseTap
	n   int64
}

func (s *pausedStream) RecvMsg(m any) error {
	s.n++
	if s.n == s.tap.pauseAt.Load() {
		s.tap.paused <- struct{}{}
		select {
		case <-s.tap.release:
		case <-s.Context().Done():
			return s.Context().Err()
		}
	}
	return s.ServerStream.RecvMsg(m)
}

// indexes returns the Index of the non-snapshot messages in msgs.
func indexes(msgs []*raftpb.Message) []uint64 {
	var out []uint64
	for _, m := range msgs {
		if m.GetType() != raftpb.MsgSnap {
			out = append(out, m.GetIndex())
		}
	}
	return out
}

// A peer whose process restarts (its transport closed and a new one
// listening on the same port): messages sent while it is down are dropped
// and reported Unreachable, coalesced to about one call per failed attempt;
// once it is back, messages flow within the backoff bound, in order.
func TestE2EPeerProcessRestart(t *testing.T) {
	const maxWait = 200 * time.Millisecond
	k := &connKiller{}
	la, lb := listen(t), listen(t)
	peers := map[uint64]string{1: la.Addr().String(), 2: lb.Addr().String()}
	a := newNodeHook(t, transport.Config{ClusterID: 1, ID: 1, Peers: peers, Dialer: k.dial, MaxReconnectWait: maxWait}, la, nil)
	b := newNodeHook(t, transport.Config{ClusterID: 1, ID: 2, Peers: peers}, lb, nil)
	sendUntil(t, a.tr, msg(1, 2, 1), "first delivery", func() bool { return len(b.rec.received(1)) > 0 })

	// b's process goes away.
	b.tr.Close()
	b.stop()
	waitFor(t, "Unreachable(2)", func() bool { return a.rec.unreachableCount(2) > 0 })
	unreach0, dials0, dropped0 := a.rec.unreachableCount(2), k.dials.Load(), a.tr.Stats().Dropped
	for i := range 100 {
		a.tr.Send([]*raftpb.Message{msg(1, 2, uint64(100+i))})
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(2 * maxWait) // let the last attempt's report go out
	unreach, dials := a.rec.unreachableCount(2)-unreach0, k.dials.Load()-dials0
	if dropped := a.tr.Stats().Dropped - dropped0; dropped < 90 {
		t.Errorf("Dropped grew by %d while the peer was down, want about 100", dropped)
	}
	if unreach == 0 || int64(unreach) > dials+1 {
		t.Errorf("%d Unreachable calls for %d failed attempts while down: want at least one, and coalesced", unreach, dials)
	}

	// A new process on the same port.
	b2 := newNodeHook(t, transport.Config{ClusterID: 1, ID: 2, Peers: peers}, listenAt(t, b.addr), nil)
	start := time.Now()
	sendUntil(t, a.tr, msg(1, 2, 1000), "delivery after the restart", func() bool { return len(b2.rec.received(1)) > 0 })
	// The bound: one backoff wait (at most maxWait) plus connecting on
	// loopback, with slack for -race.
	if took := time.Since(start); took > maxWait+time.Second {
		t.Errorf("first delivery after the restart took %v, want within about %v", took, maxWait)
	}
	base := len(b2.rec.received(1))
	var batch []*raftpb.Message
	for i := range 1000 {
		batch = append(batch, msg(1, 2, uint64(2000+i)))
	}
	for i := 0; i < len(batch); i += 100 {
		a.tr.Send(batch[i : i+100])
	}
	waitFor(t, "the batch", func() bool { return len(b2.rec.received(1)) >= base+1000 })
	got := indexes(b2.rec.received(1)[base:])
	for i, idx := range got {
		if idx != uint64(2000+i) {
			t.Fatalf("message %d after the restart has index %d, want %d (order or loss)", i, idx, 2000+i)
		}
	}
	for _, idx := range indexes(b2.rec.received(1)) {
		if idx >= 100 && idx < 200 {
			t.Fatalf("message %d sent while the peer was down reached the new process", idx)
		}
	}
}

// The connection of a snapshot transfer breaks mid-transfer: the receiver
// delivers nothing of it, the sender reports SnapshotFailure exactly once,
// and the next snapshot arrives intact and is reported SnapshotFinish.
func TestE2ESnapshotConnectionBreaks(t *testing.T) {
	k := &connKiller{}
	tap := newPauseTap(3)
	la, lb := listen(t), listen(t)
	peers := map[uint64]string{1: la.Addr().String(), 2: lb.Addr().String()}
	a := newNodeHook(t, transport.Config{ClusterID: 1, ID: 1, Peers: peers, Dialer: k.dial}, la, nil)
	b := newNodeHook(t, transport.Config{ClusterID: 1, ID: 2, Peers: peers}, lb, nil,
		tap.option(), grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10))
	sendUntil(t, a.tr, msg(1, 2, 1), "message stream up", func() bool { return len(b.rec.received(1)) > 0 })

	a.tr.Send([]*raftpb.Message{snapMsg(1, 2, 10, randomData(8<<20))})
	select {
	case <-tap.paused:
	case <-time.After(waitTimeout):
		t.Fatal("the transfer never reached its third chunk")
	}
	tap.pauseAt.Store(0)
	k.kill(0, k.count()) // every connection of a, the snapshot's included
	close(tap.release)

	waitFor(t, "SnapshotFailure", func() bool { return len(a.rec.snapshotStatuses(2)) > 0 })
	time.Sleep(200 * time.Millisecond)
	if st := a.rec.snapshotStatuses(2); !slices.Equal(st, []raft.SnapshotStatus{raft.SnapshotFailure}) {
		t.Fatalf("statuses %v, want exactly one SnapshotFailure", st)
	}
	if n := len(b.rec.receivedSnapshots(1)); n != 0 {
		t.Fatalf("%d snapshots delivered from a broken transfer", n)
	}
	if st := a.tr.Stats(); st.SnapshotsFailed != 1 || st.SnapshotsSent != 0 {
		t.Fatalf("stats %+v: want one failed snapshot", st)
	}

	want := snapMsg(1, 2, 11, randomData(3<<20+17))
	a.tr.Send([]*raftpb.Message{want})
	waitFor(t, "the next snapshot", func() bool { return len(b.rec.receivedSnapshots(1)) == 1 })
	checkSnapshot(t, b.rec.receivedSnapshots(1)[0], want)
	waitFor(t, "SnapshotFinish", func() bool { return len(a.rec.snapshotStatuses(2)) == 2 })
	if st := a.rec.snapshotStatuses(2); !slices.Equal(st, []raft.SnapshotStatus{raft.SnapshotFailure, raft.SnapshotFinish}) {
		t.Fatalf("statuses %v, want [Failure Finish]", st)
	}
	sendUntil(t, a.tr, msg(1, 2, 2), "messages after the break", func() bool {
		return slices.Contains(indexes(b.rec.received(1)), 2)
	})
}

// The message stream breaks and reconnects while a snapshot transfer runs
// on its own connection: the snapshot still arrives intact, once, and is
// reported SnapshotFinish once; messages flow again.
func TestE2ESnapshotSurvivesMessageStreamReconnect(t *testing.T) {
	k := &connKiller{}
	tap := newPauseTap(3)
	la, lb := listen(t), listen(t)
	peers := map[uint64]string{1: la.Addr().String(), 2: lb.Addr().String()}
	a := newNodeHook(t, transport.Config{ClusterID: 1, ID: 1, Peers: peers, Dialer: k.dial, MaxReconnectWait: 100 * time.Millisecond}, la, nil)
	b := newNodeHook(t, transport.Config{ClusterID: 1, ID: 2, Peers: peers}, lb, nil, tap.option())
	sendUntil(t, a.tr, msg(1, 2, 1), "message stream up", func() bool { return len(b.rec.received(1)) > 0 })
	msgConns := k.count()

	want := snapMsg(1, 2, 10, randomData(5<<20+3))
	a.tr.Send([]*raftpb.Message{want})
	select {
	case <-tap.paused:
	case <-time.After(waitTimeout):
		t.Fatal("the transfer never reached its third chunk")
	}
	// Counted before the kill: the report may come before the next line.
	before := a.rec.unreachableCount(2)
	k.kill(0, msgConns) // the message stream only
	sendUntil(t, a.tr, msg(1, 2, 2), "messages on a new stream", func() bool {
		return slices.Contains(indexes(b.rec.received(1)), 2)
	})
	if a.rec.unreachableCount(2) == before {
		t.Error("the broken message stream was not reported Unreachable")
	}
	if n := len(b.rec.receivedSnapshots(1)); n != 0 {
		t.Fatalf("%d snapshots delivered while the transfer was held", n)
	}
	close(tap.release)
	waitFor(t, "the snapshot", func() bool { return len(b.rec.receivedSnapshots(1)) == 1 })
	checkSnapshot(t, b.rec.receivedSnapshots(1)[0], want)
	waitFor(t, "SnapshotFinish", func() bool { return len(a.rec.snapshotStatuses(2)) > 0 })
	time.Sleep(100 * time.Millisecond)
	if st := a.rec.snapshotStatuses(2); !slices.Equal(st, []raft.SnapshotStatus{raft.SnapshotFinish}) {
		t.Fatalf("statuses %v, want exactly [Finish]", st)
	}
}

// Two raw transfers from the same member interleave: the newer one ends the
// older (codes.Aborted), the receiver delivers the newer one alone and
// intact, never a partial or mixed snapshot.
func TestE2ESnapshotNoMixedTransfers(t *testing.T) {
	lis := listen(t)
	a := newNodeHook(t, transport.Config{ClusterID: 1, ID: 1, Peers: map[uint64]string{1: lis.Addr().String(), 2: "127.0.0.1:1"}}, lis, nil)
	hello := &lockpb.Hello{ClusterId: 1, From: 2, To: 1}
	table := crc32.MakeTable(crc32.Castagnoli)
	header := func(index uint64, data []byte) *lockpb.SnapshotChunk {
		m := snapMsg(2, 1, index, nil)
		return &lockpb.SnapshotChunk{Hello: hello, Message: marshal(t, m), Total: uint64(len(data)), Crc32C: crc32.Checksum(data, table)}
	}
	d1, d2 := randomData(4096), randomData(4097)[:4096]
	d2[0] ^= 0xff

	cc, err := grpc.NewClient("passthrough:///"+a.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	s1, err := lockpb.NewPeerClient(cc).Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s1.Send(header(5, d1)); err != nil {
		t.Fatal(err)
	}
	if err := s1.Send(&lockpb.SnapshotChunk{Offset: 0, Data: d1[:2048]}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first transfer's chunks", func() bool { return a.tr.Stats().SnapshotChunksReceived >= 2 })

	ack, err := sendSnapshotChunks(t, a.addr, header(6, d2), &lockpb.SnapshotChunk{Offset: 0, Data: d2[:2048]},
		&lockpb.SnapshotChunk{Offset: 2048, Data: d2[2048:]})
	if err != nil || ack.GetHello().GetFrom() != 1 {
		t.Fatalf("newer transfer: ack %v, %v", ack, err)
	}
	_ = s1.Send(&lockpb.SnapshotChunk{Offset: 2048, Data: d1[2048:]})
	if _, err := s1.CloseAndRecv(); status.Code(err) != codes.Aborted {
		t.Fatalf("older transfer ended with %v, want Aborted", err)
	}
	snaps := a.rec.receivedSnapshots(2)
	if len(snaps) != 1 {
		t.Fatalf("%d snapshots delivered, want 1", len(snaps))
	}
	want := snapMsg(2, 1, 6, d2)
	checkSnapshot(t, snaps[0], want)
}

// Close with everything in flight: a Handler call blocked, frames queued
// behind it, snapshots mid-transfer in both directions, raw inbound streams
// open. Close returns, no Handler call starts or runs after it returned,
// and no goroutine is left.
func TestE2ECloseEverythingInFlight(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	const blockAt = 5
	var closedB atomic.Bool
	var late atomic.Int64
	entered := make(chan struct{}, 1)
	tapA, tapB := newPauseTap(3), newPauseTap(3)
	la, lb := listen(t), listen(t)
	peers := map[uint64]string{1: la.Addr().String(), 2: lb.Addr().String()}
	a := newNodeHook(t, transport.Config{ClusterID: 1, ID: 1, Peers: peers}, la, nil, tapA.option())
	b := newNodeHook(t, transport.Config{ClusterID: 1, ID: 2, Peers: peers}, lb, func(m *raftpb.Message) {
		if m.GetIndex() == blockAt && m.GetType() != raftpb.MsgSnap {
			select {
			case entered <- struct{}{}:
			default:
			}
			time.Sleep(500 * time.Millisecond)
		}
		if closedB.Load() {
			late.Add(1)
		}
	}, tapB.option())
	sendUntil(t, a.tr, msg(1, 2, 1), "a to b", func() bool { return len(b.rec.received(1)) > 0 })
	sendUntil(t, b.tr, msg(2, 1, 1), "b to a", func() bool { return len(a.rec.received(2)) > 0 })

	// Snapshots in both directions, held mid-transfer.
	a.tr.Send([]*raftpb.Message{snapMsg(1, 2, 10, randomData(4<<20))})
	b.tr.Send([]*raftpb.Message{snapMsg(2, 1, 10, randomData(4<<20))})
	for _, tap := range []*pauseTap{tapA, tapB} {
		select {
		case <-tap.paused:
		case <-time.After(waitTimeout):
			t.Fatal("a transfer never reached its third chunk")
		}
	}
	// A raw inbound stream to a, claiming member 2 (it supersedes b's
	// stream to a) and left open.
	rawCC, err := grpc.NewClient("passthrough:///"+a.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer rawCC.Close() // before VerifyNone (deferred earlier, runs later)
	rawCtx, rawCancel := context.WithTimeout(context.Background(), waitTimeout)
	defer rawCancel()
	raw, err := lockpb.NewPeerClient(rawCC).Stream(rawCtx)
	if err != nil {
		t.Fatal(err)
	}
	handshake(t, raw)
	// And one to b that never says Hello.
	mute, err := lockpb.NewPeerClient(rawCC2(t, b.addr, &closers)).Stream(rawCtx)
	if err != nil {
		t.Fatal(err)
	}
	_ = mute

	// b's Handler blocks, with many frames queued behind it.
	var batch []*raftpb.Message
	for i := range 3000 {
		batch = append(batch, msg(1, 2, uint64(blockAt+i)))
	}
	a.tr.Send(batch)
	select {
	case <-entered:
	case <-time.After(waitTimeout):
		t.Fatal("Handler never reached the blocking message")
	}

	done := make(chan struct{})
	closeStart := time.Now()
	go func() {
		defer close(done)
		b.tr.Close()
		closedB.Store(true)
		a.tr.Close()
	}()
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatal("Close did not return")
	}
	// The blocked Handler holds Close for up to 500 ms; the mute stream's
	// 5 s handshake timeout must not.
	if took := time.Since(closeStart); took > 3*time.Second {
		t.Errorf("Close took %v", took)
	}
	time.Sleep(100 * time.Millisecond)
	if n := late.Load(); n != 0 {
		t.Fatalf("%d Handler calls after Close returned", n)
	}
	// (a's transfer to b may legitimately fail, and be reported, when b
	// closes first; b's own transfer was ended by its Close.)
	if st := b.rec.snapshotStatuses(1); len(st) != 0 {
		t.Errorf("b reported %v for a transfer ended by Close", st)
	}
	for _, n := range []*node{a, b} {
		n.stop()
	}
	rawCancel()
	rawCC.Close()
	for _, c := range closers {
		c()
	}
	closers = nil
}

// Handshakes from strangers are refused with the documented codes and
// counted; nothing of theirs is delivered.
func TestE2EHandshakeRejections(t *testing.T) {
	const marker = 666
	lis := listen(t)
	a := newNodeHook(t, transport.Config{ClusterID: 1, ID: 1, Peers: map[uint64]string{1: lis.Addr().String(), 2: "127.0.0.1:1"}}, lis, nil)
	for i, tc := range []struct {
		name  string
		hello *lockpb.Hello
		want  codes.Code
	}{
		{"other cluster", &lockpb.Hello{ClusterId: 2, From: 2, To: 1}, codes.FailedPrecondition},
		{"other recipient", &lockpb.Hello{ClusterId: 1, From: 2, To: 3}, codes.FailedPrecondition},
		{"not in Peers", &lockpb.Hello{ClusterId: 1, From: 9, To: 1}, codes.PermissionDenied},
		{"own ID", &lockpb.Hello{ClusterId: 1, From: 1, To: 1}, codes.PermissionDenied},
		{"ID 0", &lockpb.Hello{ClusterId: 1, From: 0, To: 1}, codes.PermissionDenied},
	} {
		s := rawStream(t, a.addr)
		if err := s.Send(&lockpb.PeerFrame{Hello: tc.hello, Messages: [][]byte{marshal(t, msg(tc.hello.GetFrom(), 1, marker))}}); err != nil {
			t.Fatal(err)
		}
		expectEnd(t, s, tc.want)
		if got := a.tr.Stats().InboundRejected; got != uint64(i+1) {
			t.Fatalf("%s: InboundRejected = %d, want %d", tc.name, got, i+1)
		}
	}
	if n := len(a.rec.all()); n != 0 {
		t.Fatalf("%d messages from strangers delivered", n)
	}
}

// A legitimate member restarts while its old stream's Handler call is
// blocked: the new stream is accepted, and its messages reach Handler only
// after those the old stream delivers, never interleaved.
func TestE2ERestartedPeerDoesNotInterleave(t *testing.T) {
	lis := listen(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	a := newNodeHook(t, transport.Config{ClusterID: 1, ID: 1, Peers: map[uint64]string{1: lis.Addr().String(), 2: "127.0.0.1:1"}}, lis,
		func(m *raftpb.Message) {
			if m.GetIndex() == 1 {
				entered <- struct{}{}
				<-release
			}
		})
	old := rawStream(t, a.addr)
	handshake(t, old)
	frame := func(idx ...uint64) *lockpb.PeerFrame {
		f := &lockpb.PeerFrame{}
		for _, i := range idx {
			f.Messages = append(f.Messages, marshal(t, msg(2, 1, i)))
		}
		return f
	}
	if err := old.Send(frame(1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	if err := old.Send(frame(4, 5)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(waitTimeout):
		t.Fatal("Handler never got message 1")
	}

	// The restarted member: its handshake waits for the old stream.
	handshook := make(chan error, 1)
	newer := rawStream(t, a.addr)
	go func() {
		if err := newer.Send(&lockpb.PeerFrame{Hello: &lockpb.Hello{ClusterId: 1, From: 2, To: 1}}); err != nil {
			handshook <- err
			return
		}
		_, err := newer.Recv()
		handshook <- err
	}()
	select {
	case err := <-handshook:
		t.Fatalf("the newer stream was answered (%v) while the older one was delivering", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := newer.Send(frame(101, 102)); err != nil {
		t.Fatal(err)
	}
	close(release)
	select {
	case err := <-handshook:
		if err != nil {
			t.Fatalf("newer handshake: %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the newer stream was never accepted")
	}
	expectEnd(t, old, codes.Aborted)
	waitFor(t, "the newer stream's messages", func() bool { return slices.Contains(indexes(a.rec.received(2)), 102) })
	got := indexes(a.rec.received(2))
	seenNew := false
	for _, i := range got {
		if i >= 100 {
			seenNew = true
		} else if seenNew {
			t.Fatalf("deliveries %v: an old stream's message after the new stream's", got)
		}
	}
	if !slices.Equal(got[:3], []uint64{1, 2, 3}) || !slices.Equal(got[len(got)-2:], []uint64{101, 102}) {
		t.Fatalf("deliveries %v", got)
	}
}

// rawCC2 returns a client connection to addr whose Close is added to
// closers.
func rawCC2(t *testing.T, addr string, closers *[]func()) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	*closers = append(*closers, func() { cc.Close() })
	return cc
}

// A legitimate member restarts as a new process (its transport closed, a
// new one with the same ID on the same port): its peer accepts the new
// incarnation's stream, delivers its messages in order, one Handler call at
// a time, and reaches it again in the other direction.
func TestE2ERestartedMemberAcceptedAgain(t *testing.T) {
	var inflight, overlap atomic.Int64
	la, lb := listen(t), listen(t)
	peers := map[uint64]string{1: la.Addr().String(), 2: lb.Addr().String()}
	cfgB := transport.Config{ClusterID: 1, ID: 2, Peers: peers, MaxReconnectWait: 200 * time.Millisecond}
	a := newNodeHook(t, transport.Config{ClusterID: 1, ID: 1, Peers: peers}, la, nil)
	b := newNodeHook(t, cfgB, lb, func(m *raftpb.Message) {
		if inflight.Add(1) > 1 {
			overlap.Add(1)
		}
		time.Sleep(50 * time.Microsecond)
		inflight.Add(-1)
	})
	sendUntil(t, a.tr, msg(1, 2, 1), "a to b", func() bool { return len(b.rec.received(1)) > 0 })
	sendUntil(t, b.tr, msg(2, 1, 1), "b to a", func() bool { return len(a.rec.received(2)) > 0 })

	a.tr.Close()
	a.stop()
	a2 := newNodeHook(t, transport.Config{ClusterID: 1, ID: 1, Peers: peers}, listenAt(t, a.addr), nil)
	sendUntil(t, a2.tr, msg(1, 2, 500), "the new incarnation to b", func() bool {
		return slices.Contains(indexes(b.rec.received(1)), 500)
	})
	base := len(b.rec.received(1))
	var batch []*raftpb.Message
	for i := range 500 {
		batch = append(batch, msg(1, 2, uint64(1000+i)))
	}
	a2.tr.Send(batch)
	a2.tr.Send([]*raftpb.Message{snapMsg(1, 2, 9, randomData(2<<20))})
	waitFor(t, "the batch and the snapshot", func() bool {
		return len(b.rec.received(1)) >= base+501
	})
	got := indexes(b.rec.received(1)[base:])
	for i, idx := range got {
		if idx != uint64(1000+i) {
			t.Fatalf("message %d from the new incarnation has index %d, want %d", i, idx, 1000+i)
		}
	}
	if n := overlap.Load(); n != 0 {
		t.Fatalf("%d Handler calls overlapped for one peer", n)
	}
	if st := b.tr.Stats(); st.InboundRejected != 0 {
		t.Fatalf("InboundRejected = %d: the restarted member was refused", st.InboundRejected)
	}
	sendUntil(t, b.tr, msg(2, 1, 2), "b to the new incarnation", func() bool { return len(a2.rec.received(2)) > 0 })
}
