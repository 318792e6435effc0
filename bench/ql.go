package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"net"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock"
)

// qlSystem is quorumlock, driven through its public API only.
type qlSystem struct {
	backend quorumlock.LogBackend // Config.LogBackend ("" is the default, Pebble)
	client  clientPath            // how NewLocker's sessions reach the cluster
}

func (qlSystem) Name() string { return "ours" }

func (s qlSystem) Start(ctx context.Context, n int, dir string) (cluster, error) {
	c, err := startQL(ctx, n, dir, s.backend)
	if err != nil {
		return nil, err
	}
	c.path = s.client
	return c, nil
}

// qlCluster is n quorumlock replicas in this process, on loopback.
type qlCluster struct {
	reg     *prometheus.Registry // every replica's metrics (label member)
	dir     string
	backend quorumlock.LogBackend
	peers   map[uint64]string
	nodes   []*quorumlock.Node // nodes[i] has ID i+1; nil while stopped

	path    clientPath // of NewLocker ("" is inProcess)
	mu      sync.Mutex
	clients map[int]*quorumlock.Client // overGRPC: one per member, dialed on first use
}

func startQL(ctx context.Context, n int, dir string, backend quorumlock.LogBackend) (*qlCluster, error) {
	c := &qlCluster{reg: prometheus.NewRegistry(), dir: dir, backend: backend, peers: map[uint64]string{}, nodes: make([]*quorumlock.Node, n)}
	lis := make([]net.Listener, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			for _, l := range lis[:i] {
				l.Close()
			}
			return nil, err
		}
		lis[i], c.peers[uint64(i+1)] = l, l.Addr().String()
	}
	for i := range n {
		node, err := c.start(ctx, i, lis[i])
		if err != nil {
			for _, l := range lis[i+1:] {
				l.Close()
			}
			c.Close()
			return nil, fmt.Errorf("starting replica %d: %w", i+1, err)
		}
		c.nodes[i] = node
	}
	if _, err := c.Leader(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// start starts replica i under the pprof label replica=ID: every goroutine
// it starts (raft, service, transport, gRPC server, heartbeater) inherits
// it, so `go tool pprof -tags` splits a CPU profile by replica.
func (c *qlCluster) start(ctx context.Context, i int, lis net.Listener) (n *quorumlock.Node, err error) {
	pprof.Do(ctx, pprof.Labels("replica", strconv.Itoa(i+1)), func(ctx context.Context) {
		n, err = quorumlock.Start(ctx, c.config(i, lis))
	})
	return n, err
}

func (c *qlCluster) config(i int, lis net.Listener) quorumlock.Config {
	return quorumlock.Config{
		ID:            uint64(i + 1),
		Peers:         c.peers,
		DataDir:       filepath.Join(c.dir, fmt.Sprintf("ql%d", i+1)),
		Listener:      lis,
		SessionTTL:    defaultTTL,
		TickInterval:  tickInterval,
		ElectionTicks: electionTicks,
		Metrics:       c.reg,
		LogBackend:    c.backend,
	}
}

func (c *qlCluster) Members() int { return len(c.nodes) }

// LogSyncs: quorumlock_log_save_seconds counts the Saves that wrote (each
// one synced batch); commit-only hard states are not written.
func (c *qlCluster) LogSyncs() logSyncs { return gatherLogSyncs(c.reg, "quorumlock_log_save_seconds") }

func (c *qlCluster) Leader(ctx context.Context) (int, error) {
	for {
		leader, agree := uint64(0), true
		for _, n := range c.nodes {
			if n == nil {
				continue
			}
			l := n.Status().Leader
			if leader == 0 {
				leader = l
			}
			if l == 0 || l != leader {
				agree = false
			}
		}
		if agree && leader != 0 && c.nodes[leader-1] != nil {
			return int(leader - 1), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no agreed leader: %w", ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func (c *qlCluster) node(i int) (*quorumlock.Node, error) {
	if i < 0 || i >= len(c.nodes) || c.nodes[i] == nil {
		return nil, fmt.Errorf("replica %d is not running", i+1)
	}
	return c.nodes[i], nil
}

func (c *qlCluster) NewLocker(ctx context.Context, member int) (locker, error) {
	n, err := c.node(member)
	if err != nil {
		return nil, err
	}
	var s *quorumlock.Session
	if c.path == overGRPC {
		var cl *quorumlock.Client
		if cl, err = c.client(ctx, member); err == nil {
			s, err = cl.NewSession(ctx)
		}
	} else {
		s, err = n.NewSession(ctx)
	}
	if err != nil {
		return nil, err
	}
	return qlLocker{s}, nil
}

// client returns the gRPC client dialed at member's address, dialing it on
// first use; like etcd's side, every locker through a member shares it.
func (c *qlCluster) client(ctx context.Context, member int) (*quorumlock.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl := c.clients[member]; cl != nil {
		return cl, nil
	}
	cl, err := quorumlock.Dial(ctx, []string{c.peers[uint64(member+1)]},
		quorumlock.WithSessionTTL(defaultTTL), quorumlock.WithElectionTimeout(election))
	if err != nil {
		return nil, err
	}
	if c.clients == nil {
		c.clients = map[int]*quorumlock.Client{}
	}
	c.clients[member] = cl
	return cl, nil
}

// closeClients closes the gRPC clients (their sessions end locally).
func (c *qlCluster) closeClients() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for m, cl := range c.clients {
		cl.Close()
		delete(c.clients, m)
	}
}

// AttemptTimeout is 0: a Session re-sends a request to the new leader by
// itself, so one Acquire spans the failover.
func (c *qlCluster) AttemptTimeout() time.Duration { return 0 }

func (c *qlCluster) Stop(i int) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	c.nodes[i] = nil
	// HardClose, like a crash (etcd's side uses HardStop): Close would hand
	// leadership over first, which is not what failover measures.
	return n.HardClose()
}

func (c *qlCluster) Shutdown(i int) error {
	n, err := c.node(i)
	if err != nil {
		return err
	}
	c.nodes[i] = nil
	return n.Close()
}

func (c *qlCluster) Restart(ctx context.Context, i int) error {
	if c.nodes[i] != nil {
		return fmt.Errorf("replica %d is running", i+1)
	}
	// Without a Listener, Start listens on Peers[ID] again.
	n, err := c.start(ctx, i, nil)
	if err != nil {
		return err
	}
	c.nodes[i] = n
	return nil
}

func (c *qlCluster) Close() error {
	c.closeClients()
	var errs []error
	for i, n := range c.nodes {
		if n != nil {
			errs = append(errs, n.Close())
			c.nodes[i] = nil
		}
	}
	return errors.Join(errs...)
}

type qlLocker struct{ s *quorumlock.Session }

func (l qlLocker) Lock(ctx context.Context, name string) (func(context.Context) error, error) {
	lk, err := l.s.Acquire(ctx, name)
	if err != nil {
		return nil, err
	}
	return lk.Release, nil
}

func (l qlLocker) Close(ctx context.Context) error { return l.s.Close(ctx) }

// openSessions opens n sessions, session i through replica members[i %
// len(members)], with 256 concurrent openers.
func (c *qlCluster) openSessions(ctx context.Context, n int, members []int, opts ...quorumlock.SessionOption) ([]*quorumlock.Session, error) {
	out := make([]*quorumlock.Session, n)
	pr := newProgress("open sessions", n)
	err := parallel(ctx, n, 256, func(ctx context.Context, i int) error {
		node, err := c.node(members[i%len(members)])
		if err != nil {
			return err
		}
		s, err := node.NewSession(ctx, opts...)
		if err != nil {
			return err
		}
		out[i] = s
		pr.add(1)
		return nil
	})
	pr.finish()
	return out, err
}

// followers returns the indexes of the running replicas other than leader.
func (c *qlCluster) followers(leader int) []int {
	var out []int
	for i, n := range c.nodes {
		if n != nil && i != leader {
			out = append(out, i)
		}
	}
	return out
}

// addrs returns the replicas' addresses (peers and clients), by ID.
func (c *qlCluster) addrs() []string {
	out := make([]string, len(c.nodes))
	for i := range out {
		out[i] = c.peers[uint64(i+1)]
	}
	return out
}

func (c *qlCluster) all() []int {
	out := make([]int, len(c.nodes))
	for i := range out {
		out[i] = i
	}
	return out
}
