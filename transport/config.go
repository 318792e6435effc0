package transport

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// ErrInvalidConfig is returned (wrapped, with the name of the field) by New
// when a Config field is missing or out of range.
var ErrInvalidConfig = errors.New("quorumlock: invalid transport config")

const (
	// DefaultQueueSize is the default of Config.QueueSize.
	DefaultQueueSize = 4096
	// DefaultMaxSnapshotBytes is the default of Config.MaxSnapshotBytes:
	// 1 GiB.
	DefaultMaxSnapshotBytes = 1 << 30
	// DefaultSnapshotStallTimeout is the default of
	// Config.SnapshotStallTimeout.
	DefaultSnapshotStallTimeout = 30 * time.Second
)

// Config configures a Transport. New applies defaults to a copy; the
// caller's value is never modified.
type Config struct {
	// ClusterID identifies the cluster. Both ends of a peer stream must have
	// the same ClusterID or the handshake is rejected. Must not be 0.
	ClusterID uint64

	// ID is this replica's raft ID. Must not be 0 and must be a key of Peers.
	ID uint64

	// Peers maps the raft ID of every member, this replica's included, to its
	// peer address as "host:port". This replica's own address is not used for
	// sending. Only members listed here may open a stream to this replica.
	// New copies the map.
	Peers map[uint64]string

	// Handler is called for every message received from a peer, in the order
	// that peer sent them, except that a MsgSnap, which travels on a stream
	// of its own, may come before or after the messages sent around it. It
	// is called from transport goroutines (one at a time per peer,
	// concurrently across peers) and must not block for long: while it runs,
	// that peer's stream does not advance. Handler owns the message. It must
	// not call Close. Required.
	Handler func(m *raftpb.Message)

	// Unreachable, if set, is called when messages to id could not be
	// delivered: the stream failed or could not be opened, or the peer's
	// queue was full. The raft driver passes it to RawNode.ReportUnreachable.
	// Calls are coalesced (at most one per peer while a previous call runs,
	// and one per failed connection attempt while the peer is down) and are
	// made one at a time from a single transport goroutine, never from
	// inside Send. It must not block for long and must not call Close. The
	// default is nil: not reported.
	Unreachable func(id uint64)

	// SnapshotStatus, if set, is called for a MsgSnap after its fate is
	// known: raft.SnapshotFinish once the receiver acknowledged that the
	// whole snapshot arrived intact and was handed to its Handler,
	// raft.SnapshotFailure when the transfer failed, stalled (see
	// SnapshotStallTimeout) or was refused. A MsgSnap superseded by a newer
	// one to the same peer before its transfer started is not reported on
	// its own: the newer one's status stands for both. The raft driver
	// passes it to RawNode.ReportSnapshot (without it, a leader whose MsgSnap
	// was lost waits in snapshot state). Called like Unreachable: from the
	// same single goroutine, coalesced to the latest status per peer. The
	// default is nil: not reported.
	SnapshotStatus func(id uint64, status raft.SnapshotStatus)

	// Dialer, if set, opens the connections to peers (it is passed to
	// grpc.WithContextDialer with the peer's address exactly as in Peers).
	// Tests use it to count dials or inject faults. The default is nil: a
	// net.Dialer dialing "tcp".
	Dialer func(ctx context.Context, addr string) (net.Conn, error)

	// DialOptions are appended to the options of every peer connection,
	// after the transport's own (so they can override them, for example
	// with TLS credentials). The default is nil: insecure credentials.
	DialOptions []grpc.DialOption

	// Authorize, if set, is called for every inbound stream (messages and
	// snapshots) whose Hello passed, with the stream's context (its peer's
	// address and credentials: google.golang.org/grpc/peer.FromContext)
	// and the member ID the Hello claims. An error rejects the stream with
	// codes.PermissionDenied, counted in Stats.InboundRejected. The
	// replica uses it to require that a peer's TLS client certificate
	// verifies against the peer CA (quorumlock.Config.PeerTLS). The default
	// is nil: every member's Hello is believed.
	Authorize func(ctx context.Context, from uint64) error

	// MaxReconnectWait caps the wait between attempts to reconnect to a
	// peer. Raft messages to a disconnected peer are dropped, so a link
	// that healed should be back within about an election timeout, or
	// elections keep failing on lost votes. The default (for 0 or less) is
	// 2 s.
	MaxReconnectWait time.Duration

	// Logger receives connection events and rejections. The default is nil:
	// a no-op logger.
	Logger *zap.Logger

	// QueueSize is the capacity, in messages, of the outbound queue of each
	// peer. Send drops messages to a peer whose queue is full. The default
	// is DefaultQueueSize (4096); it must not be negative.
	QueueSize int

	// MaxSnapshotBytes bounds, in bytes, the snapshot data this replica
	// accepts from a peer. A transfer that announces more is refused before
	// any buffer is allocated for it (the sender sees codes.ResourceExhausted
	// and reports raft.SnapshotFailure). It should exceed the largest
	// snapshot the state machine can produce, on every member. The default
	// is DefaultMaxSnapshotBytes (1 GiB); it must not be negative.
	MaxSnapshotBytes int64

	// SnapshotStallTimeout is the longest a snapshot transfer may make no
	// progress before it is abandoned: on the sending side, for the
	// connection to open, for the stream to take the next chunk (gRPC flow
	// control holds it while the receiver does not read) and for the
	// receiver's acknowledgement; on the receiving side, between two chunks.
	// It bounds stalls, not the whole transfer, so it does not depend on the
	// snapshot's size. The default is DefaultSnapshotStallTimeout (30 s); it
	// must not be negative.
	SnapshotStallTimeout time.Duration
}

// withDefaults returns a copy of c with defaults applied and Peers copied.
func (c Config) withDefaults() Config {
	peers := make(map[uint64]string, len(c.Peers))
	for id, addr := range c.Peers {
		peers[id] = addr
	}
	c.Peers = peers
	if c.MaxReconnectWait <= 0 {
		c.MaxReconnectWait = backoffMax
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	if c.MaxSnapshotBytes == 0 {
		c.MaxSnapshotBytes = DefaultMaxSnapshotBytes
	}
	if c.SnapshotStallTimeout == 0 {
		c.SnapshotStallTimeout = DefaultSnapshotStallTimeout
	}
	if c.Dialer == nil {
		var d net.Dialer
		c.Dialer = func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}
	}
	c.DialOptions = append([]grpc.DialOption(nil), c.DialOptions...)
	return c
}

// validate reports the first invalid field of c, wrapping ErrInvalidConfig.
func (c *Config) validate() error {
	switch {
	case c.ClusterID == 0:
		return fmt.Errorf("%w: ClusterID is 0", ErrInvalidConfig)
	case c.ID == 0:
		return fmt.Errorf("%w: ID is 0", ErrInvalidConfig)
	case c.Handler == nil:
		return fmt.Errorf("%w: Handler is nil", ErrInvalidConfig)
	case c.QueueSize < 0:
		return fmt.Errorf("%w: QueueSize %d is negative", ErrInvalidConfig, c.QueueSize)
	case c.MaxSnapshotBytes < 0 || uint64(c.MaxSnapshotBytes) > math.MaxInt:
		return fmt.Errorf("%w: MaxSnapshotBytes %d is out of range", ErrInvalidConfig, c.MaxSnapshotBytes)
	case c.SnapshotStallTimeout < 0:
		return fmt.Errorf("%w: SnapshotStallTimeout %v is negative", ErrInvalidConfig, c.SnapshotStallTimeout)
	}
	if _, ok := c.Peers[c.ID]; !ok {
		return fmt.Errorf("%w: Peers does not list ID %d", ErrInvalidConfig, c.ID)
	}
	for id, addr := range c.Peers {
		if id == 0 {
			return fmt.Errorf("%w: Peers lists ID 0", ErrInvalidConfig)
		}
		if id == c.ID {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("%w: Peers[%d] = %q: %v", ErrInvalidConfig, id, addr, err)
		}
	}
	return nil
}
