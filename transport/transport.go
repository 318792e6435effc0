package transport

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// Transport sends raft messages to the peers of one replica and delivers the
// messages they send to it. Create it with New; all methods may be called
// from any goroutine.
type Transport struct {
	cfg   Config
	log   *zap.Logger
	peers map[uint64]*peer // immutable after New
	rep   *reporter
	stats counters

	// ctx is cancelled by Close; every goroutine of the transport watches it.
	ctx    context.Context
	cancel context.CancelFunc
	closed atomic.Bool

	mu          sync.Mutex
	stopped     bool                     // set by Close under mu, before wg.Wait
	inbound     map[uint64]*inbound      // current accepted stream per peer
	snapshotsIn map[uint64]chan struct{} // current inbound snapshot per peer: closed when superseded
	wg          sync.WaitGroup           // every goroutine and handler call in flight
}

// Stats are counters since New. Read them with Transport.Stats.
type Stats struct {
	// MessagesSent counts messages handed to a peer stream (not necessarily
	// delivered) and snapshots acknowledged by their receiver; FramesSent
	// counts the frames that carried the former.
	MessagesSent, FramesSent uint64
	// MessagesReceived counts messages delivered to Handler, snapshots
	// included.
	MessagesReceived uint64
	// Dropped counts outbound messages that were not handed to a stream
	// (queue full, peer disconnected, send failed, unknown destination, or a
	// marshal error) and snapshots that were superseded before their
	// transfer started or whose transfer failed.
	Dropped uint64
	// InboundRejected counts peer streams this transport refused at the
	// handshake (other cluster, wrong recipient, unknown sender, no Hello).
	InboundRejected uint64
	// OutboundRejected counts handshakes of this transport that the remote
	// end refused, or that were answered by another cluster or member.
	OutboundRejected uint64

	// SnapshotsSent counts snapshots whose receiver acknowledged them;
	// SnapshotsFailed those reported with raft.SnapshotFailure after their
	// transfer started. SnapshotChunksSent counts the chunks handed to
	// snapshot streams, the header chunk of each transfer included.
	SnapshotsSent, SnapshotsFailed, SnapshotChunksSent uint64
	// SnapshotsReceived counts snapshots delivered to Handler;
	// SnapshotChunksReceived the chunks received on snapshot streams whose
	// handshake succeeded. SnapshotsRejected counts inbound transfers this
	// transport refused after the handshake: malformed, larger than
	// MaxSnapshotBytes, incomplete, or failing the CRC (a refused handshake
	// counts in InboundRejected).
	SnapshotsReceived, SnapshotChunksReceived, SnapshotsRejected uint64
}

type counters struct {
	messagesSent, framesSent, messagesReceived, dropped    atomic.Uint64
	inboundRejected, outboundRejected                      atomic.Uint64
	snapshotsSent, snapshotsFailed, snapshotChunksSent     atomic.Uint64
	snapshotsReceived, snapshotChunksIn, snapshotsRejected atomic.Uint64
}

// New validates cfg and returns a running Transport. It starts two sender
// goroutines per peer, one for messages, which connects in the background
// (New itself does not dial), and one for snapshots, which connects for each
// snapshot. It does not serve inbound streams until Register is called. It
// returns an error wrapping ErrInvalidConfig if a field of cfg is invalid.
func New(cfg Config) (*Transport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	t := &Transport{
		cfg:         cfg,
		log:         cfg.Logger.With(zap.Uint64("member", cfg.ID)),
		peers:       make(map[uint64]*peer, len(cfg.Peers)),
		ctx:         ctx,
		cancel:      cancel,
		inbound:     make(map[uint64]*inbound),
		snapshotsIn: make(map[uint64]chan struct{}),
	}
	t.rep = newReporter(cfg.Unreachable, cfg.SnapshotStatus)
	ids := make([]uint64, 0, len(cfg.Peers))
	for id := range cfg.Peers {
		if id != cfg.ID {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		t.peers[id] = newPeer(t, id, cfg.Peers[id])
	}
	t.wg.Add(1 + 2*len(ids))
	go func() {
		defer t.wg.Done()
		t.rep.run(ctx)
	}()
	for _, id := range ids {
		go t.peers[id].run()
		go t.peers[id].runSnapshots()
	}
	return t, nil
}

// Register registers the Peer service of t on s. The server is shared with
// the client API and stays the caller's: t never starts or stops it. Call
// Register before s.Serve; a Transport may be registered on several servers
// (for example a replacement server after a restart). Inbound streams end
// when t is closed, so call Close before s.GracefulStop, which waits for
// them.
func (t *Transport) Register(s *grpc.Server) {
	lockpb.RegisterPeerServer(s, &peerService{t: t})
}

// Send queues msgs for their destinations (m.GetTo()) and returns without
// blocking. Send takes ownership of the messages: they must not be modified
// afterwards (the slice itself may be reused), and the snapshot of a MsgSnap
// is read, not copied, until its transfer ends. A message for a peer whose
// queue is full is dropped and the peer is reported through Unreachable; a
// message for an unknown member or for this replica is dropped. A MsgSnap
// bypasses the queue: it goes to the peer's snapshot sender, which transfers
// one snapshot at a time and keeps at most one more waiting (a newer MsgSnap
// replaces the waiting one), and its outcome is reported through
// SnapshotStatus. After Close, Send does nothing. Safe for concurrent use,
// though per-peer order is only defined for calls from one goroutine.
func (t *Transport) Send(msgs []*raftpb.Message) {
	if t.closed.Load() {
		return
	}
	for _, m := range msgs {
		p, ok := t.peers[m.GetTo()]
		if !ok {
			t.stats.dropped.Add(1)
			t.log.Debug("dropping message for unknown member",
				zap.Uint64("to", m.GetTo()), zap.Stringer("type", m.GetType()))
			continue
		}
		if isSnapshot(m) {
			p.offerSnapshot(m)
			continue
		}
		select {
		case p.queue <- m:
		default:
			t.stats.dropped.Add(1)
			t.rep.unreachable(p.id)
		}
	}
}

// Stats returns the current counters of t. Safe to call at any time, also
// after Close.
func (t *Transport) Stats() Stats {
	return Stats{
		MessagesSent:     t.stats.messagesSent.Load(),
		FramesSent:       t.stats.framesSent.Load(),
		MessagesReceived: t.stats.messagesReceived.Load(),
		Dropped:          t.stats.dropped.Load(),
		InboundRejected:  t.stats.inboundRejected.Load(),
		OutboundRejected: t.stats.outboundRejected.Load(),

		SnapshotsSent:          t.stats.snapshotsSent.Load(),
		SnapshotsFailed:        t.stats.snapshotsFailed.Load(),
		SnapshotChunksSent:     t.stats.snapshotChunksSent.Load(),
		SnapshotsReceived:      t.stats.snapshotsReceived.Load(),
		SnapshotChunksReceived: t.stats.snapshotChunksIn.Load(),
		SnapshotsRejected:      t.stats.snapshotsRejected.Load(),
	}
}

// Close stops t: it closes the outbound streams and their connections, ends
// the inbound streams (with codes.Unavailable), abandons snapshot transfers
// in both directions, and waits until every goroutine of t has returned and
// no callback is running. Messages and snapshots still queued or in transfer
// are dropped without being reported. Close is idempotent and always
// returns nil. It must not be called from Handler, Unreachable or
// SnapshotStatus (it would wait for itself).
func (t *Transport) Close() error {
	t.closed.Store(true)
	t.mu.Lock()
	t.stopped = true
	t.mu.Unlock()
	t.cancel()
	t.wg.Wait()
	return nil
}

// track adds one to t.wg unless t is closing; it reports whether it did.
// Inbound handlers use it so that Close waits for them.
func (t *Transport) track() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	t.wg.Add(1)
	return true
}
