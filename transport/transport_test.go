package transport_test

import (
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/transport"
)

// checkSequence fails unless msgs are exactly the indexes 1..n in order.
func checkSequence(t *testing.T, what string, msgs []*raftpb.Message, n int) {
	t.Helper()
	if len(msgs) != n {
		t.Fatalf("%s: got %d messages, want %d", what, len(msgs), n)
	}
	for i, m := range msgs {
		if m.GetIndex() != uint64(i+1) {
			t.Fatalf("%s: message %d has index %d, want %d (order lost)", what, i, m.GetIndex(), i+1)
		}
	}
}

// Three replicas send 10,000 messages to each other at once; every pair
// delivers all of them in order.
func TestExchangeInOrder(t *testing.T) {
	const perPair = 10000
	nodes := cluster(t, 3, func(c *transport.Config) { c.QueueSize = 2 * perPair })

	var wg sync.WaitGroup
	for _, from := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= perPair; i += 100 {
				var batch []*raftpb.Message
				for j := i; j < i+100; j++ {
					for _, to := range nodes {
						if to.id != from.id {
							batch = append(batch, msg(from.id, to.id, uint64(j)))
						}
					}
				}
				from.tr.Send(batch)
			}
		}()
	}
	wg.Wait()

	for _, to := range nodes {
		for _, from := range nodes {
			if from.id == to.id {
				continue
			}
			waitFor(t, "all messages delivered", func() bool { return len(to.rec.received(from.id)) >= perPair })
			checkSequence(t, "delivery", to.rec.received(from.id), perPair)
		}
	}
	for _, n := range nodes {
		st := n.tr.Stats()
		if st.MessagesSent != 2*perPair || st.Dropped != 0 || st.MessagesReceived != 2*perPair {
			t.Errorf("member %d: stats %+v, want %d sent and received, none dropped", n.id, st, 2*perPair)
		}
		if st.FramesSent >= st.MessagesSent {
			t.Errorf("member %d: %d frames for %d messages: no batching", n.id, st.FramesSent, st.MessagesSent)
		}
	}
}

// Messages queued while the connection is being set up leave in a few large
// frames; the dialer is called once.
func TestBatchesQueuedMessages(t *testing.T) {
	const n = 10000
	d := newGatedDialer(false)
	nodes := cluster(t, 2, func(c *transport.Config) {
		c.QueueSize = n
		if c.ID == 1 {
			c.Dialer = d.dial
		}
	})
	a, b := nodes[0], nodes[1]
	msgs := make([]*raftpb.Message, n)
	for i := range msgs {
		msgs[i] = msg(1, 2, uint64(i+1))
	}
	a.tr.Send(msgs)
	close(d.open)

	waitFor(t, "all messages delivered", func() bool { return len(b.rec.received(1)) >= n })
	checkSequence(t, "delivery", b.rec.received(1), n)
	st := a.tr.Stats()
	if st.MessagesSent != n || st.FramesSent > 5 {
		t.Errorf("stats %+v: want %d messages in at most 5 frames", st, n)
	}
	if got := d.dials.Load(); got != 1 {
		t.Errorf("dialer called %d times, want 1", got)
	}
}

// Messages larger in total than gRPC's default 4 MiB receive limit are split
// into frames the receiving server accepts.
func TestFramesCappedByBytes(t *testing.T) {
	const n = 40 // 40 x 256 KiB = 10 MiB
	d := newGatedDialer(false)
	nodes := cluster(t, 2, func(c *transport.Config) {
		if c.ID == 1 {
			c.Dialer = d.dial
		}
	})
	a, b := nodes[0], nodes[1]
	data := make([]byte, 256<<10)
	var msgs []*raftpb.Message
	for i := range n {
		m := msg(1, 2, uint64(i+1))
		m.Entries = []*raftpb.Entry{{Term: proto.Uint64(1), Index: proto.Uint64(uint64(i + 1)), Data: data}}
		msgs = append(msgs, m)
	}
	a.tr.Send(msgs)
	close(d.open)

	waitFor(t, "all messages delivered", func() bool { return len(b.rec.received(1)) >= n })
	got := b.rec.received(1)
	checkSequence(t, "delivery", got, n)
	if len(got[n-1].GetEntries()) != 1 || len(got[n-1].GetEntries()[0].GetData()) != len(data) {
		t.Fatalf("last message arrived without its entry data")
	}
	if st := a.tr.Stats(); st.FramesSent < 5 || st.FramesSent >= n {
		t.Errorf("%d frames for %d messages of 10 MiB in total: want at least 5 and fewer than %d", st.FramesSent, n, n)
	}
}

// A transport of another cluster, one claiming an unknown member ID, and one
// that thinks the replica is another member cannot deliver anything, and
// both ends observe the rejection.
func TestHandshakeRejected(t *testing.T) {
	const marker = 666
	nodes := cluster(t, 2, nil)
	a, b := nodes[0], nodes[1]

	strangers := []struct {
		name   string
		cfg    transport.Config
		target uint64 // the ID the stranger believes a has
	}{
		{"other cluster", transport.Config{ClusterID: 2, ID: 2, Peers: map[uint64]string{1: a.addr, 2: "127.0.0.1:1"}}, 1},
		{"unknown member", transport.Config{ClusterID: 1, ID: 9, Peers: map[uint64]string{1: a.addr, 9: "127.0.0.1:1"}}, 1},
		{"wrong recipient", transport.Config{ClusterID: 1, ID: 2, Peers: map[uint64]string{3: a.addr, 2: "127.0.0.1:1"}}, 3},
	}
	var sn []*node
	for _, s := range strangers {
		n := newNode(t, s.cfg, nil)
		sn = append(sn, n)
		m := msg(s.cfg.ID, s.target, marker)
		sendUntil(t, n.tr, m, s.name+": rejection seen by the stranger", func() bool {
			return n.tr.Stats().OutboundRejected > 0 && n.rec.unreachableCount(s.target) > 0
		})
	}
	waitFor(t, "rejections counted by the replica", func() bool { return a.tr.Stats().InboundRejected >= uint64(len(strangers)) })

	// a still accepts its real peer.
	sendUntil(t, b.tr, msg(2, 1, 1), "a message from the real member", func() bool { return len(a.rec.received(2)) > 0 })

	for _, m := range a.rec.all() {
		if m.GetIndex() == marker {
			t.Fatalf("a stranger's message reached Handler: %v", m)
		}
	}
	for i, n := range sn {
		if st := n.tr.Stats(); st.MessagesSent != 0 {
			t.Errorf("%s: %d messages sent past a rejected handshake", strangers[i].name, st.MessagesSent)
		}
	}
}

// Stopping a peer's server makes its messages unreachable; a server
// restarted on the same address receives them again.
func TestReconnectAfterServerRestart(t *testing.T) {
	nodes := cluster(t, 2, nil)
	a, b := nodes[0], nodes[1]
	sendUntil(t, a.tr, msg(1, 2, 1), "first delivery", func() bool { return len(b.rec.received(1)) > 0 })

	before := a.rec.unreachableCount(2)
	b.stop()
	sendUntil(t, a.tr, msg(1, 2, 2), "Unreachable(2) after the server stopped", func() bool {
		return a.rec.unreachableCount(2) > before
	})

	var lis net.Listener
	waitFor(t, "the address to be free again", func() bool {
		var err error
		lis, err = net.Listen("tcp", b.addr)
		return err == nil
	})
	b.serve(lis)
	sendUntil(t, a.tr, msg(1, 2, 3), "delivery after the restart", func() bool {
		return slices.ContainsFunc(b.rec.received(1), func(m *raftpb.Message) bool { return m.GetIndex() == 3 })
	})
}

// A failing dialer makes the peer unreachable and is retried with backoff;
// once it succeeds, messages flow.
func TestDialerFailureAndRecovery(t *testing.T) {
	d := newGatedDialer(true)
	d.fail.Store(true)
	nodes := cluster(t, 2, func(c *transport.Config) {
		if c.ID == 1 {
			c.Dialer = d.dial
		}
	})
	a, b := nodes[0], nodes[1]
	sendUntil(t, a.tr, msg(1, 2, 1), "Unreachable(2) and several dials", func() bool {
		return a.rec.unreachableCount(2) > 0 && d.dials.Load() >= 3
	})
	if got := a.tr.Stats(); got.MessagesSent != 0 || got.Dropped == 0 {
		t.Fatalf("stats %+v while the dialer fails: want nothing sent and drops counted", got)
	}
	if len(b.rec.received(1)) != 0 {
		t.Fatal("a message arrived although every dial failed")
	}
	d.fail.Store(false)
	sendUntil(t, a.tr, msg(1, 2, 2), "delivery once dialing works", func() bool { return len(b.rec.received(1)) > 0 })
}

// A full queue drops the message and reports the peer; the queued message
// leaves once the connection is up.
func TestQueueFull(t *testing.T) {
	d := newGatedDialer(false)
	nodes := cluster(t, 2, func(c *transport.Config) {
		if c.ID == 1 {
			c.Dialer = d.dial
			c.QueueSize = 1
		}
	})
	a, b := nodes[0], nodes[1]
	// The dial is held, so nothing leaves the queue of one.
	a.tr.Send([]*raftpb.Message{msg(1, 2, 1), msg(1, 2, 2), msg(1, 2, 3)})
	if st := a.tr.Stats(); st.Dropped != 2 {
		t.Fatalf("dropped %d messages, want 2", st.Dropped)
	}
	waitFor(t, "Unreachable", func() bool { return a.rec.unreachableCount(2) > 0 })

	close(d.open)
	waitFor(t, "the queued message", func() bool { return len(b.rec.received(1)) == 1 })
	if got := b.rec.received(1)[0].GetIndex(); got != 1 {
		t.Fatalf("received message %d, want the queued one (1)", got)
	}
}

// Close ends inbound and outbound streams, is idempotent, makes Send a no-op,
// and leaves no goroutine behind.
func TestClose(t *testing.T) {
	defer goleak.VerifyNone(t)
	nodes := cluster(t, 2, nil)
	a, b := nodes[0], nodes[1]
	sendUntil(t, a.tr, msg(1, 2, 1), "a to b", func() bool { return len(b.rec.received(1)) > 0 })
	sendUntil(t, b.tr, msg(2, 1, 1), "b to a", func() bool { return len(a.rec.received(2)) > 0 })

	before := b.rec.unreachableCount(1)
	if err := a.tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.tr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	statsAfterClose := a.tr.Stats()
	a.tr.Send([]*raftpb.Message{msg(1, 2, 2)}) // no-op, no panic

	// a's server still runs, but its transport refuses b's stream: b sees a
	// as unreachable and nothing more reaches a.
	sendUntil(t, b.tr, msg(2, 1, 2), "b to notice that a closed", func() bool {
		return b.rec.unreachableCount(1) > before
	})
	time.Sleep(100 * time.Millisecond)
	if got := a.tr.Stats(); got != statsAfterClose {
		t.Fatalf("stats changed after Close: %+v, then %+v", statsAfterClose, got)
	}
	if n := a.rec.unreachableCount(2); n != 0 {
		t.Errorf("Unreachable(2) called %d times, want 0 (a was never cut off before Close)", n)
	}
	for _, n := range nodes {
		n.tr.Close()
		n.stop()
	}
}

// New rejects invalid configs with ErrInvalidConfig.
func TestNewValidates(t *testing.T) {
	h := func(*raftpb.Message) {}
	peers := map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1:2"}
	for _, tc := range []struct {
		name string
		cfg  transport.Config
	}{
		{"no cluster ID", transport.Config{ID: 1, Peers: peers, Handler: h}},
		{"no ID", transport.Config{ClusterID: 1, Peers: peers, Handler: h}},
		{"no handler", transport.Config{ClusterID: 1, ID: 1, Peers: peers}},
		{"ID not in peers", transport.Config{ClusterID: 1, ID: 3, Peers: peers, Handler: h}},
		{"peer ID 0", transport.Config{ClusterID: 1, ID: 1, Peers: map[uint64]string{1: "", 0: "127.0.0.1:1"}, Handler: h}},
		{"bad address", transport.Config{ClusterID: 1, ID: 1, Peers: map[uint64]string{1: "", 2: "nowhere"}, Handler: h}},
		{"negative queue", transport.Config{ClusterID: 1, ID: 1, Peers: peers, Handler: h, QueueSize: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := transport.New(tc.cfg)
			if !errors.Is(err, transport.ErrInvalidConfig) {
				if tr != nil {
					tr.Close()
				}
				t.Fatalf("New: %v, want ErrInvalidConfig", err)
			}
		})
	}
}
