package quorumlock

import (
	"context"
	"crypto/tls"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.uber.org/zap"

	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/fsm"
)

// Bounds of a session TTL (Config.SessionTTL, WithTTL).
const (
	MinSessionTTL = time.Second
	MaxSessionTTL = 10 * time.Minute
)

// MaxNameBytesLimit is the largest Config.MaxNameBytes and the longest name
// a Client sends to the cluster.
const MaxNameBytesLimit = fsm.MaxNameBytesLimit

// Config configures one replica. Start applies the defaults to a copy; the
// caller's value is never modified.
type Config struct {
	// ID is this replica's member ID: non-zero, below 2^64-2 (raft reserves
	// the two highest IDs), and a key of Peers.
	ID uint64

	// Peers maps the ID of every voting member, this replica's included, to
	// its peer address (host:port); every ID obeys ID's rules. Peers and
	// clients connect to it. Every replica of a cluster must be given the
	// same map. Addresses must be distinct, with a port; port 0 only in
	// this replica's own address, and only with Listener set
	// (ErrInvalidConfig otherwise).
	Peers map[uint64]string

	// DataDir holds the raft log. Required. It is created if missing. A
	// directory written by another cluster (ClusterName and member IDs) or
	// another ID is refused with ErrForeignDataDir.
	DataDir string

	// LogBackend selects the durable log: LogPebble (the default: log,
	// hard state and snapshots in a Pebble database under DataDir/log) or
	// LogWAL (etcd's write-ahead log plus snapshot files under
	// DataDir/wal). A data directory keeps the backend it was created with:
	// Start refuses one holding the other backend's log with
	// ErrInvalidConfig.
	LogBackend LogBackend

	// Listener, if set, is served instead of listening on Peers[ID]; Start
	// takes ownership and Close closes it. Useful with port 0 in tests.
	Listener net.Listener

	// ClusterName distinguishes clusters that use the same member IDs: the
	// cluster ID exchanged in the peer handshake and stored in DataDir is a
	// hash of it and the member IDs. The default is "quorumlock".
	ClusterName string

	// SessionTTL is the default session TTL, in [MinSessionTTL,
	// MaxSessionTTL]. A session whose leader hears no heartbeat for a TTL
	// expires; clients heartbeat every TTL/3. The default is 10 s (the
	// Chubby/etcd range: long enough to ride out a leader election). It
	// must also exceed twice the election timeout (ElectionTicks x
	// TickInterval), or Start returns ErrInvalidConfig naming
	// ElectionTicks: with the default 1 s election timeout, SessionTTL
	// must be above 2 s.
	SessionTTL time.Duration

	// TickInterval is the duration of one raft tick, at least 1 ms and
	// below SessionTTL/6 (so that an election timeout of 3 ticks, the
	// fewest, is below half the SessionTTL). The default is 100 ms.
	TickInterval time.Duration

	// ElectionTicks is the raft election timeout in ticks (heartbeats go out
	// every tick). At least 3. The default is 10 (1 s with the default tick).
	// The election timeout must be below half of SessionTTL.
	ElectionTicks int

	// Logger receives the replica's logs. nil: no logging.
	Logger *zap.Logger
	// Metrics, when set, receives the replica's Prometheus metrics, all
	// named quorumlock_* and labelled member="<ID>" (so the replicas of
	// one process may share a registry): raft term, leadership, commit and
	// applied index; live sessions and held locks; session requests by op
	// and result code with their latency; heartbeats answered; sessions
	// expired; log write latency and entries; snapshots. Close unregisters
	// them. Registering the same member twice in one registry fails Start
	// with ErrInvalidConfig. nil: no metrics.
	Metrics prometheus.Registerer

	// Clock is the time source for ticks, session timers and client leases.
	// The default is clock.Real(). Tests may pass a clock.Manual.
	Clock clock.Clock

	// Dialer, if set, opens every connection this replica makes to its peers
	// (raft traffic and client requests forwarded to the leader). The
	// default dials TCP. Tests use it to inject network faults.
	Dialer func(ctx context.Context, addr string) (net.Conn, error)

	// TLS, if set, is the server side of TLS on this replica's port, for
	// peers and clients alike: its certificate, and for mutual TLS
	// ClientAuth = tls.RequireAndVerifyClientCert with ClientCAs. PeerTLS
	// must then be set too. nil: plaintext. With client certificates on, a
	// peer stream's certificate must also verify against PeerTLS.RootCAs,
	// so with a separate CA for the replicas (in ClientCAs next to the
	// clients' CA), a client's certificate cannot pose as a member. That
	// check is made only if PeerTLS.Certificates[0], this replica's own
	// client certificate, verifies against PeerTLS.RootCAs (the pool is
	// then the peers' CA); otherwise the handshake's check is all.
	TLS *tls.Config

	// PeerTLS, if set, is the client side of TLS for this replica's
	// connections to its peers (RootCAs, and a certificate for mutual TLS).
	// TLS and PeerTLS are set together: Start refuses either one alone
	// with ErrInvalidConfig naming PeerTLS.
	PeerTLS *tls.Config

	// SnapshotEntries is how many log entries are applied between two
	// snapshots of the lock table, at least: a snapshot also waits until
	// the payload applied since the last one adds up to a quarter of that
	// snapshot's size, so a large table is not rewritten for a few entries
	// (with 1,000,000 locks, a 20 MiB image, about every 200,000
	// entries: an acquire or release entry carries about 27 bytes). The log behind a durable snapshot is compacted, keeping
	// min(SnapshotEntries/2, 5,000) entries for followers that are a
	// little behind. The default is
	// 10,000.
	SnapshotEntries uint64

	// The table limits below are the leader's: it stamps them on every
	// request they bound (opening a session, acquiring a lock or
	// campaigning for a role) and every replica applies the request under
	// them, so replicas configured differently (during a rolling change of
	// a limit) still hold the same table. A changed limit takes effect
	// once a replica configured with it leads. A replica that does not
	// lead also checks MaxNameBytes on the requests of its own sessions.
	// A lowered MaxNameBytes refuses new acquires of longer names; the
	// locks and roles of such names granted before stay with their
	// holders, who can still release (resign), proclaim and withdraw them,
	// and reads (Holder, Leader, Observe) answer for such a name while it
	// is held, so its holder can be found (and revoked); for a longer
	// name nobody holds they return ErrInvalidName.

	// MaxNameBytes bounds lock names and roles, in bytes: at most 65,536
	// (MaxNameBytesLimit). The default is 256. Clients (Dial) accept any
	// name up to MaxNameBytesLimit and leave this bound to the cluster,
	// which refuses a longer name with ErrInvalidName.
	MaxNameBytes int
	// MaxSessions bounds live sessions in the cluster. The default is
	// 1,000,000.
	MaxSessions int
	// MaxLocksPerSession bounds the locks one session holds or waits for.
	// The default is 10,000.
	MaxLocksPerSession int
	// MaxWaitersPerLock bounds the queue of one lock. The default is 10,000.
	MaxWaitersPerLock int

	// failpoint is raftnode's Config.Failpoint, set only by test builds
	// through internal/testhook.SetFailpoint; nil otherwise.
	failpoint func(point string)
}

// LogBackend names a durable log implementation.
type LogBackend string

// The log backends.
const (
	LogPebble LogBackend = "pebble"
	LogWAL    LogBackend = "wal"
)

func (c *Config) withDefaults() Config {
	out := *c
	if out.LogBackend == "" {
		out.LogBackend = LogPebble
	}
	if out.ClusterName == "" {
		out.ClusterName = "quorumlock"
	}
	if out.SessionTTL == 0 {
		out.SessionTTL = 10 * time.Second
	}
	if out.TickInterval == 0 {
		out.TickInterval = 100 * time.Millisecond
	}
	if out.ElectionTicks == 0 {
		out.ElectionTicks = 10
	}
	if out.Logger == nil {
		out.Logger = zap.NewNop()
	}
	if out.Clock == nil {
		out.Clock = clock.Real()
	}
	if out.MaxNameBytes == 0 {
		out.MaxNameBytes = 256
	}
	if out.MaxSessions == 0 {
		out.MaxSessions = 1_000_000
	}
	if out.MaxLocksPerSession == 0 {
		out.MaxLocksPerSession = 10_000
	}
	if out.MaxWaitersPerLock == 0 {
		out.MaxWaitersPerLock = 10_000
	}
	// Peers is copied so that later changes by the caller do not reach us.
	out.Peers = make(map[uint64]string, len(c.Peers))
	for id, addr := range c.Peers {
		out.Peers[id] = addr
	}
	return out
}

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
}

// validate checks a Config that has its defaults applied.
func (c *Config) validate() error {
	if c.ID == 0 {
		return invalid("ID", "must be non-zero")
	}
	if raft.IsLocalMsgTarget(c.ID) {
		return invalid("ID", "%d is reserved by raft (its local storage threads)", c.ID)
	}
	if len(c.Peers) == 0 {
		return invalid("Peers", "must list every voting member")
	}
	if _, ok := c.Peers[c.ID]; !ok {
		return invalid("ID", "%d is not a key of Peers", c.ID)
	}
	seen := make(map[string]uint64, len(c.Peers))
	for _, id := range c.memberIDs() {
		addr := c.Peers[id]
		if id == 0 {
			return invalid("Peers", "member ID 0 is not allowed")
		}
		if raft.IsLocalMsgTarget(id) {
			return invalid("Peers", "member ID %d is reserved by raft (its local storage threads)", id)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return invalid("Peers", "member %d: address %q: %v", id, addr, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 0 || p > 65535 || (p == 0 && (id != c.ID || c.Listener == nil)) {
			return invalid("Peers", "member %d: address %q has no usable port", id, addr)
		}
		key := net.JoinHostPort(host, strconv.Itoa(p))
		if other, dup := seen[key]; dup {
			return invalid("Peers", "members %d and %d share address %q", other, id, addr)
		}
		seen[key] = id
	}
	if (c.TLS == nil) != (c.PeerTLS == nil) {
		return invalid("PeerTLS", "TLS and PeerTLS must be set together")
	}
	if c.LogBackend != LogPebble && c.LogBackend != LogWAL {
		return invalid("LogBackend", "%q is neither %q nor %q", c.LogBackend, LogPebble, LogWAL)
	}
	if c.DataDir == "" {
		return invalid("DataDir", "must be set")
	}
	if c.SessionTTL < MinSessionTTL || c.SessionTTL > MaxSessionTTL {
		return invalid("SessionTTL", "%v is outside [%v, %v]", c.SessionTTL, MinSessionTTL, MaxSessionTTL)
	}
	if c.TickInterval < time.Millisecond {
		return invalid("TickInterval", "%v is below 1ms", c.TickInterval)
	}
	if c.ElectionTicks < 3 {
		return invalid("ElectionTicks", "%d is below 3", c.ElectionTicks)
	}
	if c.TickInterval > MaxSessionTTL/6 || 6*c.TickInterval >= c.SessionTTL {
		// No ElectionTicks (at least 3) keeps the election timeout below
		// half the SessionTTL: the tick itself is out of range. (The first
		// test also keeps 6 x TickInterval from overflowing.)
		return invalid("TickInterval", "%v is too long for SessionTTL %v: an election timeout of at least 3 ticks must be below half the SessionTTL", c.TickInterval, c.SessionTTL)
	}
	if int64(c.ElectionTicks) > int64(MaxSessionTTL/c.TickInterval) {
		// Also keeps TickInterval x ElectionTicks from overflowing.
		return invalid("ElectionTicks", "%d ticks of %v exceed %v", c.ElectionTicks, c.TickInterval, MaxSessionTTL)
	}
	if et := c.electionTimeout(); et*2 >= c.SessionTTL {
		return invalid("ElectionTicks", "election timeout %v must be below half the SessionTTL %v, or sessions expire during elections", et, c.SessionTTL)
	}
	for _, l := range []struct {
		name string
		v    int
	}{{"MaxNameBytes", c.MaxNameBytes}, {"MaxSessions", c.MaxSessions}, {"MaxLocksPerSession", c.MaxLocksPerSession}, {"MaxWaitersPerLock", c.MaxWaitersPerLock}} {
		if l.v < 1 {
			return invalid(l.name, "%d must be positive", l.v)
		}
	}
	if c.MaxNameBytes > MaxNameBytesLimit {
		return invalid("MaxNameBytes", "%d is above %d", c.MaxNameBytes, MaxNameBytesLimit)
	}
	return nil
}

func (c *Config) electionTimeout() time.Duration {
	return time.Duration(c.ElectionTicks) * c.TickInterval
}

// memberIDs returns the member IDs in ascending order.
func (c *Config) memberIDs() []uint64 {
	ids := make([]uint64, 0, len(c.Peers))
	for id := range c.Peers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// clusterID hashes the cluster name and the member IDs (FNV-1a, 64 bit).
func (c *Config) clusterID() uint64 {
	h := fnv.New64a()
	h.Write([]byte(c.ClusterName))
	for _, id := range c.memberIDs() {
		h.Write(strconv.AppendUint([]byte{0}, id, 10))
	}
	if v := h.Sum64(); v != 0 {
		return v
	}
	return 1
}
