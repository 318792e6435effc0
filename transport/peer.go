package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

const (
	// maxFrameBytes caps the marshaled messages of one frame. It stays well
	// under gRPC's default 4 MiB receive limit, which the shared server of
	// the receiving replica may keep.
	maxFrameBytes = 2 << 20
	// maxFrameMessages caps the number of messages of one frame.
	maxFrameMessages = 4096
	// frameOverhead is the protobuf framing of one message inside a frame:
	// field tag and length varint.
	frameOverhead = 6
	// handshakeTimeout bounds dialing, opening the stream and the Hello
	// exchange of one connection attempt.
	handshakeTimeout = 5 * time.Second
	// Reconnect backoff: the wait after the n-th consecutive failure is drawn
	// from [d/2, d) with d = backoffBase * 2^(n-1), at most backoffMax.
	backoffBase = 50 * time.Millisecond
	backoffMax  = 2 * time.Second
)

// errRejected marks a handshake that the other end refused or answered as
// another cluster or member.
var errRejected = errors.New("quorumlock: peer handshake rejected")

// peer is the transport's state for one member: on the outbound side its
// queue and the goroutine (run) that connects and sends, and its snapshot
// slot and the goroutine (runSnapshots) that transfers snapshots; on the
// inbound side the lock that serializes its Handler calls.
type peer struct {
	t     *Transport
	id    uint64
	addr  string
	log   *zap.Logger
	queue chan *raftpb.Message

	// Owned by the run goroutine.
	held     *raftpb.Message // taken from queue but did not fit into the last frame
	sizeHint int             // arena capacity for the next frame, in bytes

	snapMu      sync.Mutex
	snapPending *raftpb.Message // the next MsgSnap to transfer, if any
	snapKick    chan struct{}   // capacity 1: snapPending was set

	// deliver is held around Handler calls for messages from this member, so
	// that its message stream and its snapshot stream call Handler one at a
	// time.
	deliver sync.Mutex
}

func newPeer(t *Transport, id uint64, addr string) *peer {
	return &peer{
		t:        t,
		id:       id,
		addr:     addr,
		log:      t.log.With(zap.Uint64("peer", id), zap.String("addr", addr)),
		queue:    make(chan *raftpb.Message, t.cfg.QueueSize),
		sizeHint: 512,
		snapKick: make(chan struct{}, 1),
	}
}

// run connects to the peer and sends its queue until the transport closes,
// reconnecting with backoff. It runs on its own goroutine, started by New.
func (p *peer) run() {
	defer p.t.wg.Done()
	ctx := p.t.ctx
	b := backoff{max: p.t.cfg.MaxReconnectWait}
	failures := 0
	for {
		connected, err := p.attempt(ctx)
		if ctx.Err() != nil {
			return
		}
		if connected {
			b.reset()
			failures = 0
		}
		failures++
		if p.held != nil {
			p.drop()
			p.held = nil
		}
		p.t.rep.unreachable(p.id)
		// Log the first failure of a streak loudly and the repeats quietly.
		level := zap.DebugLevel
		switch {
		case errors.Is(err, errRejected):
			level = zap.ErrorLevel
			if failures > 1 {
				level = zap.DebugLevel
			}
		case failures == 1:
			level = zap.WarnLevel
		}
		p.log.Log(level, "peer stream failed", zap.Bool("was_connected", connected), zap.Int("failures", failures), zap.Error(err))
		if !p.wait(ctx, b.next()) {
			return
		}
	}
}

// wait sleeps for d, dropping whatever is queued meanwhile. It returns false
// if ctx was done first.
func (p *peer) wait(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		case <-p.queue:
			p.drop()
		}
	}
}

// drop counts a message that will not be sent. The caller reports
// Unreachable.
func (p *peer) drop() {
	p.t.stats.dropped.Add(1)
}

// attempt makes one connection: it dials, shakes hands and sends until the
// stream fails or ctx is done. connected reports whether the handshake
// succeeded. The connection is closed and every goroutine of the attempt has
// returned when attempt returns.
func (p *peer) attempt(ctx context.Context) (connected bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// One ClientConn per attempt: the reconnect schedule is this package's
	// backoff, not gRPC's (which starts at 1 s and grows to 2 min).
	cc, err := p.dial()
	if err != nil {
		return false, err
	}
	defer cc.Close()

	stream, err := p.handshake(ctx, cancel, cc)
	if err != nil {
		return false, err
	}
	p.log.Info("peer stream connected")

	// The reply direction carries nothing after the handshake; reading it
	// notices promptly when the peer ends the stream.
	broken := make(chan error, 1)
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		for {
			if _, err := stream.Recv(); err != nil {
				broken <- err
				return
			}
		}
	}()
	defer func() {
		cancel()
		<-watcherDone
	}()
	return true, p.pump(ctx, stream, broken)
}

// dial returns a new ClientConn to the peer. It connects on first use.
func (p *peer) dial() (*grpc.ClientConn, error) {
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(p.t.cfg.Dialer),
	}, p.t.cfg.DialOptions...)
	return grpc.NewClient("passthrough:///"+p.addr, opts...)
}

// handshake opens the stream and exchanges Hellos (steps 1 and 3 of the
// protocol in doc.go) within handshakeTimeout, after which it cancels the
// attempt through cancel.
func (p *peer) handshake(ctx context.Context, cancel context.CancelFunc, cc *grpc.ClientConn) (lockpb.Peer_StreamClient, error) {
	timer := time.AfterFunc(handshakeTimeout, cancel)
	cfg := &p.t.cfg
	stream, err := lockpb.NewPeerClient(cc).Stream(ctx)
	if err == nil {
		err = stream.Send(&lockpb.PeerFrame{Hello: &lockpb.Hello{ClusterId: cfg.ClusterID, From: cfg.ID, To: p.id}})
		if errors.Is(err, io.EOF) {
			err = nil // the server ended the stream; Recv returns its status
		}
	}
	var answer *lockpb.PeerFrame
	if err == nil {
		answer, err = stream.Recv()
	}
	if !timer.Stop() {
		return nil, fmt.Errorf("handshake did not finish within %v", handshakeTimeout)
	}
	if err != nil {
		return nil, p.rejection(err)
	}
	if h := answer.GetHello(); h.GetClusterId() != cfg.ClusterID || h.GetFrom() != p.id || h.GetTo() != cfg.ID {
		p.t.stats.outboundRejected.Add(1)
		return nil, fmt.Errorf("%w: answered with cluster %d, member %d, to %d (want cluster %d, member %d, to %d)",
			errRejected, h.GetClusterId(), h.GetFrom(), h.GetTo(), cfg.ClusterID, p.id, cfg.ID)
	}
	return stream, nil
}

// pump sends the queue, one frame per round, until the stream fails or ctx
// is done.
func (p *peer) pump(ctx context.Context, stream lockpb.Peer_StreamClient, broken <-chan error) error {
	for {
		m := p.held
		p.held = nil
		if m == nil {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case err := <-broken:
				return fmt.Errorf("stream ended by peer: %w", err)
			case m = <-p.queue:
			}
		}
		frame := p.fill(m)
		n := uint64(len(frame.Messages))
		if n == 0 {
			continue
		}
		if err := stream.Send(frame); err != nil {
			p.t.stats.dropped.Add(n)
			if errors.Is(err, io.EOF) {
				// The stream has ended; its status comes from Recv.
				select {
				case err = <-broken:
				case <-ctx.Done():
				}
			}
			return fmt.Errorf("send: %w", err)
		}
		p.t.stats.messagesSent.Add(n)
		p.t.stats.framesSent.Add(1)
	}
}

// fill builds the frame that starts with m and goes on with whatever is
// already queued, up to maxFrameMessages and maxFrameBytes. A message that
// does not fit is kept in p.held for the next frame.
func (p *peer) fill(m *raftpb.Message) *lockpb.PeerFrame {
	// A fresh arena per frame: gRPC may read a sent message lazily (stats
	// handlers), so its bytes are never reused.
	arena := make([]byte, 0, p.sizeHint)
	var msgs [][]byte
	size := 0
	for m != nil {
		start := len(arena)
		var err error
		arena, err = proto.MarshalOptions{}.MarshalAppend(arena, m)
		n := len(arena) - start
		switch {
		case err != nil:
			arena = arena[:start]
			p.drop()
			p.log.Error("cannot marshal raft message; dropped", zap.Stringer("type", m.GetType()), zap.Error(err))
		case len(msgs) > 0 && size+n+frameOverhead > maxFrameBytes:
			p.held = m
			m = nil
			continue
		default:
			if n > maxFrameBytes {
				p.log.Warn("raft message larger than a frame; sending it alone",
					zap.Stringer("type", m.GetType()), zap.Int("bytes", n))
			}
			msgs = append(msgs, arena[start:len(arena):len(arena)])
			size += n + frameOverhead
		}
		m = nil
		if len(msgs) < maxFrameMessages {
			select {
			case m = <-p.queue:
			default:
			}
		}
	}
	p.sizeHint = min(max(size, 512), maxFrameBytes)
	return &lockpb.PeerFrame{Messages: msgs}
}

// backoff is the reconnect schedule of one peer.
type backoff struct {
	n   int
	max time.Duration // backoffMax if 0
}

func (b *backoff) reset() { b.n = 0 }

// next returns the wait before the next attempt: uniform in [d/2, d), with d
// doubling from backoffBase up to b.max.
func (b *backoff) next() time.Duration {
	limit := b.max
	if limit <= 0 {
		limit = backoffMax
	}
	// b.n stops growing long before the shift could overflow (50 ms << 30
	// is about 1.7 years).
	d := backoffBase << b.n
	if b.n >= 30 || d >= limit {
		d = limit
	} else {
		b.n++
	}
	// A max of 1 ns leaves no range to draw from (rand.N panics on 0).
	if d < 2 {
		return d
	}
	return d/2 + rand.N(d/2)
}
