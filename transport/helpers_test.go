package transport_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/transport"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait of these tests.
const waitTimeout = 10 * time.Second

// recorder collects what a transport hands to its callbacks.
type recorder struct {
	mu          sync.Mutex
	msgs        []*raftpb.Message
	unreachable map[uint64]int
	snapshots   map[uint64][]raft.SnapshotStatus
}

func newRecorder() *recorder {
	return &recorder{unreachable: map[uint64]int{}, snapshots: map[uint64][]raft.SnapshotStatus{}}
}

func (r *recorder) handle(m *raftpb.Message) {
	r.mu.Lock()
	r.msgs = append(r.msgs, m)
	r.mu.Unlock()
}

func (r *recorder) onUnreachable(id uint64) {
	r.mu.Lock()
	r.unreachable[id]++
	r.mu.Unlock()
}

func (r *recorder) onSnapshot(id uint64, st raft.SnapshotStatus) {
	r.mu.Lock()
	r.snapshots[id] = append(r.snapshots[id], st)
	r.mu.Unlock()
}

// received returns the messages received so far from member from.
func (r *recorder) received(from uint64) []*raftpb.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*raftpb.Message
	for _, m := range r.msgs {
		if m.GetFrom() == from {
			out = append(out, m)
		}
	}
	return out
}

func (r *recorder) all() []*raftpb.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*raftpb.Message(nil), r.msgs...)
}

func (r *recorder) unreachableCount(id uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.unreachable[id]
}

func (r *recorder) snapshotStatuses(id uint64) []raft.SnapshotStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]raft.SnapshotStatus(nil), r.snapshots[id]...)
}

// node is one replica of a test: a transport served on its own loopback
// gRPC server.
type node struct {
	id   uint64
	addr string
	tr   *transport.Transport
	rec  *recorder

	mu  sync.Mutex
	srv *grpc.Server
}

// listen opens a loopback listener on a free port.
func listen(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// newNode creates a transport for cfg (Handler, Unreachable, SnapshotStatus
// and Logger are filled in) and serves it on lis. Cleanup closes the
// transport, then stops the server.
func newNode(t *testing.T, cfg transport.Config, lis net.Listener) *node {
	t.Helper()
	return newNodeHook(t, cfg, lis, nil)
}

// newNodeHook is newNode with hook called before each message is recorded
// (it may block, as a slow Handler would) and with the server's options.
func newNodeHook(t *testing.T, cfg transport.Config, lis net.Listener, hook func(*raftpb.Message), opts ...grpc.ServerOption) *node {
	t.Helper()
	n := &node{id: cfg.ID, rec: newRecorder()}
	if lis != nil {
		n.addr = lis.Addr().String()
	}
	cfg.Handler = func(m *raftpb.Message) {
		if hook != nil {
			hook(m)
		}
		n.rec.handle(m)
	}
	cfg.Unreachable = n.rec.onUnreachable
	cfg.SnapshotStatus = n.rec.onSnapshot
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	tr, err := transport.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.tr = tr
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		n.stop()
	})
	if lis != nil {
		n.serve(lis, opts...)
	}
	return n
}

// serve starts a new gRPC server for n's transport on lis, built with opts.
func (n *node) serve(lis net.Listener, opts ...grpc.ServerOption) {
	srv := grpc.NewServer(opts...)
	n.tr.Register(srv)
	n.mu.Lock()
	n.srv = srv
	n.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
}

// stop stops n's gRPC server (not its transport).
func (n *node) stop() {
	n.mu.Lock()
	srv := n.srv
	n.srv = nil
	n.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// cluster starts n members of cluster 1 with IDs 1..n; mod, if set, adjusts
// each config before its transport is created.
func cluster(t *testing.T, n int, mod func(*transport.Config)) []*node {
	t.Helper()
	lis := make([]net.Listener, n)
	peers := map[uint64]string{}
	for i := range lis {
		lis[i] = listen(t)
		peers[uint64(i+1)] = lis[i].Addr().String()
	}
	nodes := make([]*node, n)
	for i := range nodes {
		cfg := transport.Config{ClusterID: 1, ID: uint64(i + 1), Peers: peers}
		if mod != nil {
			mod(&cfg)
		}
		nodes[i] = newNode(t, cfg, lis[i])
	}
	return nodes
}

// msg returns a MsgApp from from to to whose Index is index (tests use the
// index as a sequence number or a marker).
func msg(from, to, index uint64) *raftpb.Message {
	return &raftpb.Message{
		Type:  raftpb.MsgApp.Enum(),
		From:  proto.Uint64(from),
		To:    proto.Uint64(to),
		Term:  proto.Uint64(1),
		Index: proto.Uint64(index),
	}
}

// waitFor polls cond until it holds or waitTimeout passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitTimeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// sendUntil resends m every 20 ms (as raft would retransmit) until cond
// holds or waitTimeout passes.
func sendUntil(t *testing.T, tr *transport.Transport, m *raftpb.Message, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", waitTimeout, what)
		}
		tr.Send([]*raftpb.Message{m})
		time.Sleep(20 * time.Millisecond)
	}
}

// gatedDialer dials TCP once open is closed, counting the calls; while
// fail is set it fails instead.
type gatedDialer struct {
	open  chan struct{}
	fail  atomic.Bool
	dials atomic.Int64
}

func newGatedDialer(opened bool) *gatedDialer {
	d := &gatedDialer{open: make(chan struct{})}
	if opened {
		close(d.open)
	}
	return d
}

func (d *gatedDialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	d.dials.Add(1)
	select {
	case <-d.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if d.fail.Load() {
		return nil, errors.New("injected dial failure")
	}
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", addr)
}
