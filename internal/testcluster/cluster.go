// Package testcluster runs an in-process quorumlock cluster for tests: N
// real replicas (raft, Pebble log, gRPC) on loopback, each with its own data
// directory, whose links go through a fault-injecting Network. Replicas can
// be stopped and restarted on the same address and data, and links can be
// cut, delayed and made lossy.
package testcluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/quorumlock/quorumlock"
)

// Options configure a cluster. Zero fields take the defaults.
type Options struct {
	// Size is the number of replicas. The default is 3.
	Size int
	// TickInterval is the raft tick. The default is 10 ms (fast elections
	// for tests: 100 ms election timeout with the default ElectionTicks).
	TickInterval time.Duration
	// ElectionTicks defaults to 10.
	ElectionTicks int
	// SessionTTL defaults to 4 s: long enough that sessions ride out
	// elections on a loaded machine under the race detector.
	SessionTTL time.Duration
	// Verbose logs the replicas through the test's log.
	Verbose bool
	// Configure, if set, adjusts each replica's Config before it starts.
	Configure func(*quorumlock.Config)
	// Seed seeds the network's random faults. The default is 1.
	Seed uint64
}

// Cluster is a running test cluster.
type Cluster struct {
	t    testing.TB
	opts Options
	Net  *Network

	mu    sync.Mutex
	ids   []uint64
	peers map[uint64]string
	dirs  map[uint64]string
	nodes map[uint64]*quorumlock.Node
	name  string // ClusterName, unique per cluster
}

// New starts a cluster and registers its shutdown with t.Cleanup.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Size == 0 {
		opts.Size = 3
	}
	if opts.TickInterval == 0 {
		opts.TickInterval = 10 * time.Millisecond
	}
	if opts.ElectionTicks == 0 {
		opts.ElectionTicks = 10
	}
	if opts.SessionTTL == 0 {
		opts.SessionTTL = 4 * time.Second
	}
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	c := &Cluster{
		t:     t,
		opts:  opts,
		Net:   newNetwork(opts.Seed),
		peers: make(map[uint64]string),
		dirs:  make(map[uint64]string),
		nodes: make(map[uint64]*quorumlock.Node),
		// A name of its own, so that the peer handshake refuses a replica
		// of another test's cluster (same member IDs) that got the
		// address of a stopped member here: tests run in parallel.
		name: fmt.Sprintf("testcluster-%016x", rand.Uint64()),
	}
	base := t.TempDir()
	listeners := make(map[uint64]net.Listener)
	for i := 1; i <= opts.Size; i++ {
		id := uint64(i)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		listeners[id] = lis
		c.ids = append(c.ids, id)
		c.peers[id] = lis.Addr().String()
		c.dirs[id] = filepath.Join(base, fmt.Sprintf("r%d", id))
		c.Net.register(id, c.peers[id])
	}
	t.Cleanup(c.StopAll)
	for _, id := range c.ids {
		c.start(id, listeners[id])
	}
	return c
}

// IDs returns the member IDs, ascending.
func (c *Cluster) IDs() []uint64 { return slices.Clone(c.ids) }

// Peers returns the peer map every replica was given.
func (c *Cluster) Peers() map[uint64]string {
	out := make(map[uint64]string, len(c.peers))
	for id, a := range c.peers {
		out[id] = a
	}
	return out
}

// Config returns the Config replica id is started with (Listener unset).
func (c *Cluster) Config(id uint64) quorumlock.Config {
	cfg := quorumlock.Config{
		ID:            id,
		ClusterName:   c.name,
		Peers:         c.Peers(),
		DataDir:       c.dirs[id],
		SessionTTL:    c.opts.SessionTTL,
		TickInterval:  c.opts.TickInterval,
		ElectionTicks: c.opts.ElectionTicks,
		Dialer:        c.Net.Dialer(id),
	}
	if c.opts.Verbose {
		cfg.Logger = zaptest.NewLogger(c.t, zaptest.Level(zap.InfoLevel)).Named(fmt.Sprintf("r%d", id))
	}
	if c.opts.Configure != nil {
		c.opts.Configure(&cfg)
	}
	return cfg
}

func (c *Cluster) start(id uint64, lis net.Listener) {
	c.t.Helper()
	cfg := c.Config(id)
	cfg.Listener = lis
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := quorumlock.Start(ctx, cfg)
	if err != nil {
		c.t.Fatalf("start replica %d: %v", id, err)
	}
	c.mu.Lock()
	c.nodes[id] = n
	c.mu.Unlock()
}

// Node returns replica id, or nil while it is stopped.
func (c *Cluster) Node(id uint64) *quorumlock.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// Running returns the IDs of the running replicas.
func (c *Cluster) Running() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []uint64
	for _, id := range c.ids {
		if c.nodes[id] != nil {
			out = append(out, id)
		}
	}
	return out
}

// Stop stops replica id the way a crash does, without handing leadership
// over (Node.HardClose); its data stays for Restart.
func (c *Cluster) Stop(id uint64) { c.stop(id, (*quorumlock.Node).HardClose) }

// Close stops replica id with Node.Close: a leader hands leadership over
// first. Its data stays for Restart.
func (c *Cluster) Close(id uint64) { c.stop(id, (*quorumlock.Node).Close) }

func (c *Cluster) stop(id uint64, close func(*quorumlock.Node) error) {
	c.mu.Lock()
	n := c.nodes[id]
	delete(c.nodes, id)
	c.mu.Unlock()
	if n != nil {
		if err := close(n); err != nil {
			c.t.Errorf("close replica %d: %v", id, err)
		}
	}
}

// StopAll stops every running replica (HardClose: a test's teardown does
// not wait for leadership transfers).
func (c *Cluster) StopAll() {
	for _, id := range c.ids {
		c.Stop(id)
	}
}

// Restart starts a stopped replica again on its address and data.
func (c *Cluster) Restart(id uint64) {
	c.t.Helper()
	var lis net.Listener
	var err error
	for range 100 {
		if lis, err = net.Listen("tcp", c.peers[id]); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatalf("relisten replica %d on %s: %v", id, c.peers[id], err)
	}
	c.start(id, lis)
}

// Leader returns the leader that a majority of the running replicas agree
// on, or 0.
func (c *Cluster) Leader() uint64 {
	votes := make(map[uint64]int)
	for _, id := range c.Running() {
		if n := c.Node(id); n != nil {
			if l := n.Status().Leader; l != 0 {
				votes[l]++
			}
		}
	}
	for l, v := range votes {
		if v > len(c.ids)/2 && c.Node(l) != nil && c.Node(l).Status().Leader == l {
			return l
		}
	}
	return 0
}

// WaitLeader waits until a majority agrees on a running leader and returns
// it; it fails the test after timeout.
func (c *Cluster) WaitLeader(timeout time.Duration) uint64 {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if l := c.Leader(); l != 0 {
			return l
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.t.Fatalf("no leader within %v", timeout)
	return 0
}

// ElectionTimeout returns the configured election timeout.
func (c *Cluster) ElectionTimeout() time.Duration {
	return time.Duration(c.opts.ElectionTicks) * c.opts.TickInterval
}

// Isolate cuts replica id off from every other replica.
func (c *Cluster) Isolate(id uint64) { c.Net.Isolate(id, c.ids) }

// Heal lifts every network fault.
func (c *Cluster) Heal() { c.Net.Heal() }

// Partition splits the replicas into groups that cannot reach each other,
// both ways (Network.Partition): the cluster's own name for the fault the
// core issue lists next to stop and restart.
func (c *Cluster) Partition(groups ...[]uint64) { c.Net.Partition(groups...) }

// Cut makes the link from -> to lose everything until Heal (Network.Cut).
func (c *Cluster) Cut(from, to uint64) { c.Net.Cut(from, to) }

// Delay delays every write on the link from -> to by d until Heal
// (Network.SetDelay, which says how the delay adds up).
func (c *Cluster) Delay(from, to uint64, d time.Duration) { c.Net.SetDelay(from, to, d) }

// Drop makes each write on the link from -> to fail with probability p
// until Heal (Network.SetDrop).
func (c *Cluster) Drop(from, to uint64, p float64) { c.Net.SetDrop(from, to, p) }
