package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// etcdSystem is the baseline: embedded etcd members with the client/v3
// concurrency Mutex and leases, fsync on (the default).
type etcdSystem struct {
	client clientPath // how NewLocker's sessions reach the cluster
}

func (etcdSystem) Name() string { return "etcd" }

func (s etcdSystem) Start(ctx context.Context, n int, dir string) (cluster, error) {
	c, err := startEtcd(ctx, n, dir)
	if err != nil {
		return nil, err
	}
	c.path = s.client
	return c, nil
}

// etcdCluster is n embedded etcd members in this process, on loopback.
type etcdCluster struct {
	dir        string
	token      string
	peerURLs   []url.URL
	clientURLs []url.URL
	members    []*embed.Etcd      // nil while stopped
	clients    []*clientv3.Client // one per member, pinned to its endpoint
	// path is NewLocker's client path ("" is inProcess); inproc holds
	// each running member's in-process client (v3client), made on first
	// use.
	path   clientPath
	mu     sync.Mutex
	inproc []*clientv3.Client
	ctx    context.Context // ends with the cluster: keeps sessions' keepalives
	cancel context.CancelFunc
	// keepAlives counts successful lease keepalive responses received by
	// every client of this cluster (a gRPC stream interceptor).
	keepAlives atomic.Int64
	// lastKeepAlive is when the last of them arrived (unix nanoseconds).
	lastKeepAlive atomic.Int64
}

// startEtcd starts an etcd cluster. Its ports are picked free and then
// bound by etcd, so another process can take one in between (the machine
// may be shared): a start that fails to bind is retried on new ports and a
// fresh data directory.
func startEtcd(ctx context.Context, n int, dir string) (*etcdCluster, error) {
	for attempt := 0; ; attempt++ {
		c, err := startEtcdOnce(ctx, n, filepath.Join(dir, fmt.Sprintf("try%d", attempt)))
		if err == nil || attempt == 2 || !(errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")) {
			return c, err
		}
		logf("  etcd start: %v; retrying on other ports", err)
	}
}

func startEtcdOnce(ctx context.Context, n int, dir string) (*etcdCluster, error) {
	c := &etcdCluster{
		dir:     dir,
		token:   fmt.Sprintf("bench-%d", time.Now().UnixNano()),
		members: make([]*embed.Etcd, n),
		clients: make([]*clientv3.Client, n),
		inproc:  make([]*clientv3.Client, n),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	for i := range n {
		c.peerURLs = append(c.peerURLs, url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i])})
		c.clientURLs = append(c.clientURLs, url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])})
	}
	for i := range n {
		e, err := embed.StartEtcd(c.config(i))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("starting etcd member %d: %w", i, err)
		}
		c.members[i] = e
	}
	for i, e := range c.members {
		select {
		case <-e.Server.ReadyNotify():
		case err := <-e.Err():
			c.Close()
			return nil, fmt.Errorf("etcd member %d: %w", i, err)
		case <-ctx.Done():
			c.Close()
			return nil, fmt.Errorf("etcd member %d not ready: %w", i, ctx.Err())
		}
	}
	for i := range n {
		cl, err := c.newClient(i)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.clients[i] = cl
	}
	if _, err := c.Leader(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *etcdCluster) config(i int) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = fmt.Sprintf("m%d", i)
	cfg.Dir = filepath.Join(c.dir, cfg.Name)
	cfg.ListenPeerUrls = []url.URL{c.peerURLs[i]}
	cfg.AdvertisePeerUrls = []url.URL{c.peerURLs[i]}
	cfg.ListenClientUrls = []url.URL{c.clientURLs[i]}
	cfg.AdvertiseClientUrls = []url.URL{c.clientURLs[i]}
	var ic []string
	for j, u := range c.peerURLs {
		ic = append(ic, fmt.Sprintf("m%d=%s", j, u.String()))
	}
	cfg.InitialCluster = strings.Join(ic, ",")
	cfg.InitialClusterToken = c.token
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.TickMs = uint(tickInterval / time.Millisecond)
	cfg.ElectionMs = uint(election / time.Millisecond)
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.EnableGRPCGateway = false
	return cfg
}

// newClient returns a client pinned to member i's endpoint.
func (c *etcdCluster) newClient(i int) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   []string{c.clientURLs[i].Host},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(c.countKeepAlives)},
	})
}

func (c *etcdCluster) countKeepAlives(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Lease/LeaseKeepAlive" {
		return cs, err
	}
	return &kaCounter{ClientStream: cs, n: &c.keepAlives, last: &c.lastKeepAlive}, nil
}

type kaCounter struct {
	grpc.ClientStream
	n, last *atomic.Int64
}

func (s *kaCounter) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*pb.LeaseKeepAliveResponse); err == nil && ok && r.TTL > 0 {
		s.n.Add(1)
		s.last.Store(time.Now().UnixNano())
	}
	return err
}

func (c *etcdCluster) Members() int { return len(c.members) }

func (c *etcdCluster) Leader(ctx context.Context) (int, error) {
	for {
		var lead uint64
		agree := true
		for _, e := range c.members {
			if e == nil {
				continue
			}
			l := uint64(e.Server.Leader())
			if lead == 0 {
				lead = l
			}
			if l == 0 || l != lead {
				agree = false
			}
		}
		if agree && lead != 0 {
			for i, e := range c.members {
				if e != nil && uint64(e.Server.MemberID()) == lead {
					return i, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no agreed etcd leader: %w", ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func (c *etcdCluster) NewLocker(ctx context.Context, member int) (locker, error) {
	if c.clients[member] == nil {
		return nil, fmt.Errorf("etcd member %d is not running", member)
	}
	cl := c.clients[member]
	if c.path != overGRPC {
		cl = c.inProcess(member)
	}
	s, err := newEtcdSession(ctx, c.ctx, cl, int(defaultTTL/time.Second))
	if err != nil {
		return nil, err
	}
	return etcdLocker{s}, nil
}

// inProcess returns member's in-process client, making it on first use:
// v3client.New, which etcd provides for applications embedding a member.
func (c *etcdCluster) inProcess(member int) *clientv3.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inproc[member] == nil {
		c.inproc[member] = v3client.New(c.members[member].Server)
	}
	return c.inproc[member]
}

// closeInProcess closes member's in-process client, if it has one.
func (c *etcdCluster) closeInProcess(member int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.inproc[member]
	c.inproc[member] = nil
	if cl == nil {
		return nil
	}
	// An in-process client has no connection: its Close reports the
	// cancelling of its own context.
	if err := cl.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// newEtcdSession opens a concurrency.Session (a lease kept alive until life
// ends), giving up when ctx ends.
func newEtcdSession(ctx, life context.Context, cl *clientv3.Client, ttl int) (*concurrency.Session, error) {
	type result struct {
		s   *concurrency.Session
		err error
	}
	res := make(chan result, 1)
	go func() {
		s, err := concurrency.NewSession(cl, concurrency.WithTTL(ttl), concurrency.WithContext(life))
		res <- result{s, err}
	}()
	select {
	case r := <-res:
		return r.s, r.err
	case <-ctx.Done():
		go func() {
			if r := <-res; r.s != nil {
				r.s.Orphan()
			}
		}()
		return nil, ctx.Err()
	}
}

// AttemptTimeout: an etcd client does not move a request off a dead leader
// by itself (a proposal forwarded to it waits for the request timeout), so
// the failover client starts a fresh Lock attempt every 20 ms, each given
// 1 s.
func (c *etcdCluster) AttemptTimeout() time.Duration { return time.Second }

// Stop stops member i like a crash: HardStop first, since a graceful Close
// would hand leadership over before stopping, which is not what a failover
// measures.
func (c *etcdCluster) Stop(i int) error { return c.stop(i, true) }

// Shutdown closes member i gracefully: etcd's server hands leadership to
// a connected member before it stops (EtcdServer.Stop).
func (c *etcdCluster) Shutdown(i int) error { return c.stop(i, false) }

func (c *etcdCluster) stop(i int, hard bool) error {
	if c.members[i] == nil {
		return fmt.Errorf("etcd member %d is not running", i)
	}
	if c.clients[i] != nil {
		c.clients[i].Close()
		c.clients[i] = nil
	}
	c.closeInProcess(i)
	if hard {
		c.members[i].Server.HardStop()
	}
	c.members[i].Close()
	c.members[i] = nil
	return nil
}

// LogSyncs: etcd's WAL fsync histogram (etcd_disk_wal_fsync_duration_seconds),
// which every member in this process shares in the default registry.
func (c *etcdCluster) LogSyncs() logSyncs {
	return gatherLogSyncs(prometheus.DefaultGatherer, "etcd_disk_wal_fsync_duration_seconds")
}

func (c *etcdCluster) Restart(ctx context.Context, i int) error {
	if c.members[i] != nil {
		return fmt.Errorf("etcd member %d is running", i)
	}
	e, err := embed.StartEtcd(c.config(i))
	if err != nil {
		return err
	}
	c.members[i] = e
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
	cl, err := c.newClient(i)
	if err != nil {
		return err
	}
	c.clients[i] = cl
	return nil
}

func (c *etcdCluster) Close() error {
	c.cancel()
	var errs []error
	for i, cl := range c.clients {
		if cl != nil {
			errs = append(errs, cl.Close())
			c.clients[i] = nil
		}
		errs = append(errs, c.closeInProcess(i))
	}
	for i, e := range c.members {
		if e != nil {
			e.Close()
			c.members[i] = nil
		}
	}
	return errors.Join(errs...)
}

type etcdLocker struct{ s *concurrency.Session }

func (l etcdLocker) Lock(ctx context.Context, name string) (func(context.Context) error, error) {
	m := concurrency.NewMutex(l.s, "/bench/"+name)
	if err := m.Lock(ctx); err != nil {
		return nil, err
	}
	return m.Unlock, nil
}

func (l etcdLocker) Close(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- l.s.Close() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// grantLeases grants n leases of ttl seconds, lease i through clients[i %
// len(clients)], with 256 concurrent granters. With a non-nil keep, each
// lease is kept alive from its grant until keep ends (the response channels
// are not drained: the client drops what does not fit, and the keepalive
// interceptor has counted it).
func grantLeases(ctx, keep context.Context, clients []*clientv3.Client, n int, ttl int64) ([]clientv3.LeaseID, error) {
	out := make([]clientv3.LeaseID, n)
	pr := newProgress("grant leases", n)
	err := parallel(ctx, n, 256, func(ctx context.Context, i int) error {
		cl := clients[i%len(clients)]
		r, err := cl.Grant(ctx, ttl)
		if err != nil {
			return err
		}
		out[i] = r.ID
		if keep != nil {
			if _, err := cl.KeepAlive(keep, r.ID); err != nil {
				return fmt.Errorf("keepalive: %w", err)
			}
		}
		pr.add(1)
		return nil
	})
	pr.finish()
	return out, err
}

// mutexKey is the key concurrency.Mutex creates for a session's lease on
// the lock pfx.
func mutexKey(pfx string, id clientv3.LeaseID) string { return fmt.Sprintf("%s/%x", pfx, int64(id)) }

func (c *etcdCluster) running() []*clientv3.Client {
	var out []*clientv3.Client
	for _, cl := range c.clients {
		if cl != nil {
			out = append(out, cl)
		}
	}
	return out
}
