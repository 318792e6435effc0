package quorumlock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/service"
	"github.com/quorumlock/quorumlock/raftnode"
	"github.com/quorumlock/quorumlock/storage"
	"github.com/quorumlock/quorumlock/storage/pebblestore"
	"github.com/quorumlock/quorumlock/storage/walstore"
	"github.com/quorumlock/quorumlock/transport"
)

// Node is one running replica. Its methods are safe for concurrent use. On
// a nil or zero Node (the nil of a failed Start) they do not panic: the
// calls that return an error return one wrapping ErrClosed (Err and Close
// too), Done and Observe's channel are closed, ID is 0, Addr nil and
// Status zero.
type Node struct {
	cfg   Config
	log   *zap.Logger
	store storage.LogStore
	raft  *raftnode.Node
	// raftReady publishes raft to the transport's goroutines once built.
	raftReady atomic.Pointer[raftnode.Node]
	svc       *service.Service
	tr        *transport.Transport
	server    *grpc.Server
	lis       net.Listener
	router    *router
	hb        *heartbeater
	metrics   *nodeMetrics // nil without Config.Metrics

	closeOnce sync.Once
	closed    chan struct{}
	baseCtx   context.Context // cancelled (cause ErrClosed) by Close
	cancel    context.CancelCauseFunc
	serveDone chan struct{}
}

// Status is a replica's view of the cluster.
type Status struct {
	ID      uint64 // this replica
	Leader  uint64 // the leader this replica knows of; 0 if unknown
	Term    uint64 // raft term
	Commit  uint64 // highest log index known committed
	Applied uint64 // highest log index applied to this replica's lock table
}

// LockInfo describes a lock as of a linearizable read.
type LockInfo struct {
	Name    string
	Holder  uint64   // session ID of the holder; 0 when the lock is free
	Token   Token    // fencing token of the current grant; 0 when free
	Waiters []uint64 // session IDs waiting, in the order they will be granted
}

// Start validates cfg, opens (or creates) the replica's data directory,
// starts raft and starts serving peers and clients on Peers[ID] (or
// cfg.Listener). It does not wait for a leader to be elected: sessions and
// reads opened right away wait for one, within their contexts.
//
// Errors: ErrInvalidConfig naming the field (also for a data directory
// holding the other LogBackend's log, and for metrics already registered
// for this member); ErrForeignDataDir; storage errors naming the file
// (storage.ErrCorrupt for damaged data; the log directory instead of the
// file for damage only decoding the lock table finds, such as a snapshot
// image that passed its file's checksum); a listen error; ctx's error if
// ctx has ended when Start is called. ctx also bounds the listen; opening
// the log (replaying it) does not watch ctx.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	ctx = orBackground(ctx)
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		if cfg.Listener != nil {
			cfg.Listener.Close()
		}
		return nil, err
	}
	n, err := start(ctx, cfg)
	if err != nil && cfg.Listener != nil {
		cfg.Listener.Close()
	}
	return n, err
}

func start(ctx context.Context, cfg Config) (_ *Node, err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The address is taken before the data directory is touched, so a
	// replica that cannot listen (address in use) leaves no stamped log
	// behind.
	lis := cfg.Listener
	if lis == nil {
		var lc net.ListenConfig
		if lis, err = lc.Listen(ctx, "tcp", cfg.Peers[cfg.ID]); err != nil {
			return nil, fmt.Errorf("quorumlock: listen: %w", err)
		}
		defer func() {
			if err != nil {
				lis.Close()
			}
		}()
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("quorumlock: data directory: %w", err)
	}
	store, err := openLog(cfg)
	if err != nil {
		return nil, fmt.Errorf("quorumlock: opening log: %w", err)
	}
	defer func() {
		if err != nil {
			store.Close()
		}
	}()
	if err := checkIdentity(store, storage.Identity{ClusterID: cfg.clusterID(), MemberID: cfg.ID}, cfg.DataDir); err != nil {
		return nil, err
	}

	n := &Node{
		cfg:       cfg,
		log:       cfg.Logger.With(zap.Uint64("member", cfg.ID)),
		store:     store,
		closed:    make(chan struct{}),
		serveDone: make(chan struct{}),
	}
	n.baseCtx, n.cancel = context.WithCancelCause(context.Background())
	n.metrics = newNodeMetrics(cfg.Metrics, n)
	n.svc = service.New(service.Config{
		Hooks: n.metrics.serviceHooks(),
		Peers: cfg.Peers,
		Limits: fsm.Limits{
			MaxNameBytes:       cfg.MaxNameBytes,
			MaxSessions:        cfg.MaxSessions,
			MaxLocksPerSession: cfg.MaxLocksPerSession,
			MaxWaitersPerLock:  cfg.MaxWaitersPerLock,
			MaxValueBytes:      MaxValueBytes,
			MinTTL:             int64(MinSessionTTL),
			MaxTTL:             int64(MaxSessionTTL),
		},
		Clock:        cfg.Clock,
		ScanInterval: cfg.TickInterval,
		ReadyWait:    cfg.electionTimeout(),
		Logger:       n.log,
	})
	tr, err := transport.New(transport.Config{
		ClusterID: cfg.clusterID(),
		ID:        cfg.ID,
		Peers:     cfg.Peers,
		// A healed link is back within an election timeout.
		MaxReconnectWait: cfg.electionTimeout(),
		// The transport may call back before the raft node exists; until
		// then there is nobody to tell.
		Handler: func(m *raftpb.Message) {
			if r := n.raftReady.Load(); r != nil {
				r.Step(m)
			}
		},
		Unreachable: func(id uint64) {
			if r := n.raftReady.Load(); r != nil {
				r.ReportUnreachable(id)
			}
		},
		SnapshotStatus: func(id uint64, st raft.SnapshotStatus) {
			if r := n.raftReady.Load(); r != nil {
				r.ReportSnapshot(id, st)
			}
		},
		Dialer:      cfg.Dialer,
		DialOptions: peerDialOptions(cfg.PeerTLS),
		Authorize:   peerAuthorizer(cfg.TLS, cfg.PeerTLS),
		Logger:      cfg.Logger, // the transport adds "member" itself
	})
	if err != nil {
		return nil, fmt.Errorf("quorumlock: transport: %w", err)
	}
	n.tr = tr
	n.raft, err = raftnode.New(raftnode.Config{
		ID:            cfg.ID,
		Peers:         cfg.memberIDs(),
		Storage:       store,
		Transport:     tr,
		StateMachine:  n.svc,
		Clock:         cfg.Clock,
		TickInterval:  cfg.TickInterval,
		ElectionTicks: cfg.ElectionTicks,
		// A twentieth of a tick (5 ms by default): hand-offs commit
		// one after another well within it, so a commit's notice is
		// mostly replaced by the next append (see the field).
		CommitNoticeHold: cfg.TickInterval / 20,
		SnapshotEntries:  cfg.SnapshotEntries,
		Logger:           n.log,
		OnSave:           n.metrics.onSave(),
		OnSnapshot:       n.metrics.onSnapshot(),
		Failpoint:        cfg.failpoint, // nil outside test builds
		OnFatal: func(err error) {
			n.log.Error("replica stopped", zap.Error(err))
			go n.HardClose()
		},
	})
	if err != nil {
		tr.Close()
		if errors.Is(err, raftnode.ErrCorruptState) {
			// The stores checked their records; this is damage only the
			// state machine or raft can see (a snapshot image that does
			// not decode, say): damaged data all the same.
			return nil, fmt.Errorf("quorumlock: %s: %w: %w", logDir(cfg), storage.ErrCorrupt, err)
		}
		return nil, err
	}
	n.svc.Bind(n.raft)
	n.raftReady.Store(n.raft)
	if err = n.metrics.register(); err != nil {
		tr.Close()
		return nil, err
	}

	n.lis = lis
	n.server = grpc.NewServer(serverOptions(cfg.TLS)...)
	tr.Register(n.server)
	lockpb.RegisterLockServer(n.server, n.svc)
	n.router = newRouter(n)
	n.hb = newHeartbeater(n.router, cfg.Clock, n.closed)

	go func() {
		defer close(n.serveDone)
		if err := n.server.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			n.log.Warn("serve", zap.Error(err))
		}
	}()
	n.raft.Start()
	go n.svc.Run()
	n.hb.start()
	n.log.Info("replica started", zap.String("addr", lis.Addr().String()), zap.Int("members", len(cfg.Peers)))
	return n, nil
}

// logDir is the directory under DataDir that cfg's backend keeps its log in.
func logDir(cfg Config) string {
	if cfg.LogBackend == LogWAL {
		return filepath.Join(cfg.DataDir, "wal")
	}
	return filepath.Join(cfg.DataDir, "log")
}

// openLog opens the configured backend. A directory made by the other
// backend is refused rather than silently started empty.
func openLog(cfg Config) (storage.LogStore, error) {
	dir, other := logDir(cfg), filepath.Join(cfg.DataDir, "wal")
	if cfg.LogBackend == LogWAL {
		other = filepath.Join(cfg.DataDir, "log")
	}
	if _, err := os.Stat(other); err == nil {
		return nil, fmt.Errorf("%w: %s holds a log of the other backend (%s); LogBackend is %q",
			ErrInvalidConfig, cfg.DataDir, filepath.Base(other), cfg.LogBackend)
	}
	if cfg.LogBackend == LogWAL {
		return walstore.Open(dir, walstore.Options{Logger: cfg.Logger})
	}
	return pebblestore.Open(dir, pebblestore.Options{Logger: cfg.Logger})
}

// serverOptions: TLS if configured, and a keepalive policy that admits the
// clients' pings (dialOptions).
func serverOptions(tlsCfg *tls.Config) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.StaticStreamWindowSize(streamWindow),
		grpc.StaticConnWindowSize(connWindow),
	}
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	return opts
}

// peerDialOptions are the transport's: TLS when configured (the transport
// adds its own dialer).
func peerDialOptions(tlsCfg *tls.Config) []grpc.DialOption {
	opts := []grpc.DialOption{grpc.WithStaticStreamWindowSize(streamWindow), grpc.WithStaticConnWindowSize(connWindow)}
	if tlsCfg == nil {
		return opts
	}
	return append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
}

// peerAuthorizer is the transport's check of an inbound peer stream. With
// client certificates on (serverTLS.ClientAuth other than NoClientCert),
// the stream's certificate must also verify against peerTLS.RootCAs, the
// CA that peers' certificates come from (the system roots if nil): peers
// and clients share the port and serverTLS.ClientCAs, so with a separate
// peer CA a client's certificate cannot open a peer stream and pose as a
// member (etcd's --peer-trusted-ca-file does the same). With one CA for
// both, any holder of a client certificate is trusted as a peer. Without
// client certificates, nil: the Hello is believed.
//
// RootCAs is the peers' CA only if this replica's own client certificate
// (peerTLS.Certificates[0]) verifies against it: otherwise the pool says
// nothing about the certificates peers present as clients (a PKI with one
// CA for servers and another for clients, replicas included; a peer side
// that checks servers its own way, InsecureSkipVerify with
// VerifyPeerCertificate, RootCAs nil), checking against it would refuse
// every peer, and the check is off (nil): the handshake's verification of
// the certificate is all, as before streams were authorized. So is it
// when the peer side has no fixed certificate (GetClientCertificate).
func peerAuthorizer(serverTLS, peerTLS *tls.Config) func(context.Context, uint64) error {
	if serverTLS == nil || peerTLS == nil || serverTLS.ClientAuth == tls.NoClientCert || len(peerTLS.Certificates) == 0 {
		return nil
	}
	roots := peerTLS.RootCAs
	if own, err := parseChain(peerTLS.Certificates[0]); err != nil || verifyChain(own, roots) != nil {
		return nil
	}
	return func(ctx context.Context, _ uint64) error {
		p, ok := peer.FromContext(ctx)
		if !ok {
			return errors.New("no connection information")
		}
		info, ok := p.AuthInfo.(credentials.TLSInfo)
		if !ok || len(info.State.PeerCertificates) == 0 {
			return errors.New("no TLS client certificate")
		}
		chain := info.State.PeerCertificates
		if err := verifyChain(chain, roots); err != nil {
			return fmt.Errorf("client certificate %q is not from the peer CA (Config.PeerTLS.RootCAs): %w", chain[0].Subject.CommonName, err)
		}
		return nil
	}
}

// verifyChain verifies chain[0] against roots, with the rest of chain as
// intermediates, for any key usage.
func verifyChain(chain []*x509.Certificate, roots *x509.CertPool) error {
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// parseChain returns the certificates of c, leaf first.
func parseChain(c tls.Certificate) ([]*x509.Certificate, error) {
	if len(c.Certificate) == 0 {
		return nil, errors.New("no certificate")
	}
	chain := make([]*x509.Certificate, len(c.Certificate))
	for i, der := range c.Certificate {
		if i == 0 && c.Leaf != nil {
			chain[0] = c.Leaf
			continue
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, err
		}
		chain[i] = cert
	}
	return chain, nil
}

func checkIdentity(store storage.LogStore, want storage.Identity, dir string) error {
	have, ok, err := store.Identity()
	if err != nil {
		return fmt.Errorf("quorumlock: reading identity of %s: %w", dir, err)
	}
	if ok {
		if have != want {
			return fmt.Errorf("%w: %s was written by member %d of cluster %x, this is member %d of cluster %x",
				ErrForeignDataDir, dir, have.MemberID, have.ClusterID, want.MemberID, want.ClusterID)
		}
		return nil
	}
	last, err := store.LastIndex()
	if err != nil {
		return fmt.Errorf("quorumlock: reading %s: %w", dir, err)
	}
	hs, _, err := store.InitialState()
	if err != nil {
		return fmt.Errorf("quorumlock: reading %s: %w", dir, err)
	}
	if last != 0 || !raft.IsEmptyHardState(hs) {
		return fmt.Errorf("%w: %s has a log but no identity", ErrForeignDataDir, dir)
	}
	if err := store.SetIdentity(want); err != nil {
		return fmt.Errorf("quorumlock: recording identity in %s: %w", dir, err)
	}
	return nil
}

// ID returns this replica's member ID.
func (n *Node) ID() uint64 {
	if n.nilNode() {
		return 0
	}
	return n.cfg.ID
}

// Addr returns the address the replica serves on.
func (n *Node) Addr() net.Addr {
	if n.nilNode() {
		return nil
	}
	return n.lis.Addr()
}

// Status returns this replica's current view (no network round trip).
// Once the replica has stopped (Close, or a failure: Done closes), it is
// the last view it had, which names the leader it handed over to (Close)
// or last knew of, but never itself: a stopped replica leads nothing, so
// Leader is 0 where it had led until it stopped.
func (n *Node) Status() Status {
	if n.nilNode() {
		return Status{}
	}
	st := n.raft.Status()
	s := Status{ID: st.ID, Leader: st.Leader, Term: st.Term, Commit: st.Commit, Applied: st.Applied}
	if s.Leader == s.ID && (n.isClosed() || isDone(n.raft.Done())) {
		s.Leader = 0
	}
	return s
}

// isDone reports whether c is closed.
func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Holder returns who holds the lock name, with its token and waiters, as of
// a linearizable read (DESIGN.md invariant 9): confirmed by the leader
// through ReadIndex, then served once this replica has applied that index.
// A replica cut off from the majority blocks until ctx ends and returns
// ctx's error; it never answers from stale state. Errors: ErrInvalidName
// (also for a name longer than MaxNameBytes that nobody holds; one held
// since before a rolling change lowered the limit is answered), ErrClosed,
// ctx's error.
func (n *Node) Holder(ctx context.Context, name string) (LockInfo, error) {
	if n.nilNode() {
		return LockInfo{}, errNoNode
	}
	ctx = orBackground(ctx)
	if err := checkName(name, MaxNameBytesLimit); err != nil { // longer than MaxNameBytes: answered while held (Config.MaxNameBytes)
		return LockInfo{}, err
	}
	if n.isClosed() {
		return LockInfo{}, ErrClosed
	}
	ctx, cancel := n.bound(ctx)
	defer cancel()
	resp, err := n.svc.Holder(ctx, &lockpb.HolderRequest{Name: name})
	if err != nil {
		return LockInfo{}, n.ctxErr(ctx, err)
	}
	if resp.GetCode() == lockpb.Code_CODE_INVALID {
		return LockInfo{}, fmt.Errorf("%w: %s (%s)", ErrInvalidName, quoteShort(name), resp.GetMessage())
	}
	return LockInfo{Name: name, Holder: resp.GetSession(), Token: Token(resp.GetToken()), Waiters: resp.GetWaiters()}, nil
}

// Done is closed when the replica has stopped: Close was called, or a
// storage failure stopped it, or a peer's message that raft cannot accept
// (one no correct peer sends, such as a commit index past this replica's
// log; then Err says why, wrapping raftnode.ErrBadMessage). A process that
// embeds a replica should exit or restart it when Done closes.
func (n *Node) Done() <-chan struct{} {
	if n.nilNode() {
		return closedChan
	}
	return n.closed
}

// Err returns the storage error (or the bad peer message) that stopped the
// replica, or nil.
func (n *Node) Err() error {
	if n.nilNode() {
		return errNoNode
	}
	return n.raft.Err()
}

// Close stops the replica. A leader first hands leadership to the follower
// with the longest log among those it heard from recently (raft's
// leadership transfer, thesis §3.10; etcd's server does the same when it
// stops) and waits up to an election timeout (ElectionTicks x TickInterval)
// for it to take over: the cluster has a leader again a round trip later
// instead of after a failover, and requests in flight on this replica are
// answered "not the leader" and retried by their clients at the new one.
// Then it stops serving, stops raft and closes the log. Sessions opened
// through this Node are reported lost at once (their Done and their locks'
// Lost channels close); their locks are freed by the cluster when their
// TTL runs out. Idempotent; returns nil after the first call. The first
// call returns an error closing the log, and the error that stopped the
// replica if one did while it ran; when a failure stops the replica
// (Done closes), the replica makes that first call itself, so a later
// Close returns nil: Err reports the failure.
func (n *Node) Close() error { return n.close(true) }

// HardClose stops the replica like Close but without handing leadership
// over: to the other replicas it looks like a crash, and they elect a new
// leader once they notice (a broken connection and two missed heartbeats,
// or an election timeout). It is what tests and benchmarks that measure
// failover use (etcd's HardStop is the counterpart). Idempotent, and a
// no-op after Close.
func (n *Node) HardClose() error { return n.close(false) }

func (n *Node) close(handoff bool) error {
	if n.nilNode() {
		return errNoNode
	}
	var err error
	n.closeOnce.Do(func() {
		close(n.closed)
		n.cancel(ErrClosed)
		n.hb.loseAll(ErrClosed)
		if handoff && n.raft.Status().State == raft.StateLeader {
			n.handOff()
		}
		n.server.Stop()
		<-n.serveDone
		n.raft.Stop()
		n.svc.Stop()
		n.tr.Close()
		n.router.close()
		n.hb.wait()
		err = n.store.Close()
		if fatal := n.raft.Err(); fatal != nil {
			err = errors.Join(err, fatal)
		}
		n.metrics.unregister()
		n.log.Info("replica stopped")
	})
	return err
}

// handOff transfers leadership before Close stops the replica.
func (n *Node) handOff() {
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.electionTimeout())
	defer cancel()
	start := time.Now()
	if err := n.raft.Resign(ctx); err != nil {
		n.log.Warn("leadership not handed over before stopping", zap.Duration("waited", time.Since(start)), zap.Error(err))
		return
	}
	st := n.raft.Status()
	n.log.Info("leadership handed over", zap.Uint64("leader", st.Leader), zap.Uint64("term", st.Term), zap.Duration("took", time.Since(start)))
}

func (n *Node) isClosed() bool { return isDone(n.closed) }

// bound derives a context that also ends when the Node closes.
func (n *Node) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(n.baseCtx, func() { cancel(ErrClosed) })
	return ctx, func() { stop(); cancel(nil) }
}

// ctxErr turns an error seen under a bound context into the caller's error.
func (n *Node) ctxErr(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
		if errors.Is(cause, ErrClosed) {
			return ErrClosed
		}
		return cause
	}
	if errors.Is(err, raftnode.ErrStopped) {
		return ErrClosed
	}
	return err
}
