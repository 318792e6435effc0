package main

import (
	"context"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The election timing both systems run with, so that failover compares
// like with like: raft ticks of 100 ms, an election timeout of 10 ticks.
const (
	tickInterval  = 100 * time.Millisecond
	electionTicks = 10
	election      = electionTicks * tickInterval
	// defaultTTL is the session TTL (quorumlock's default; etcd's lease TTL
	// in the scenarios that use the Mutex path).
	defaultTTL = 10 * time.Second
)

// clientPath is how a scenario's lockers reach a cluster; both systems use
// the same one in a run (-client).
type clientPath string

const (
	// inProcess: the application is linked with the member it talks to.
	// quorumlock: Node.NewSession on the member; etcd: the member's
	// in-process client (v3client.New(e.Server): clientv3 calling the
	// server's gRPC handlers as functions, no socket).
	inProcess clientPath = "inproc"
	// overGRPC: a separate client process's view, over loopback gRPC.
	// quorumlock: one quorumlock.Client per member, dialed at that
	// member's address (it follows leader hints, so its requests go to
	// the leader); etcd: one clientv3.Client per member, pinned to that
	// member's endpoint (a follower forwards to the leader).
	overGRPC clientPath = "grpc"
)

// system is one implementation under test: quorumlock ("ours") or etcd.
// The generic scenarios (throughput, latency, hand-off, failover) drive a
// cluster through the same code; the heavy ones (heartbeats, memory,
// expiry) need each system's own bulk path and are methods here.
type system interface {
	Name() string
	// Start runs a cluster of n members on loopback, with data under dir,
	// and waits until it has a leader.
	Start(ctx context.Context, n int, dir string) (cluster, error)
	Heartbeats(ctx context.Context, p *params) (measure, error)
	Memory(ctx context.Context, p *params) (measure, error)
	ExpiryStorm(ctx context.Context, p *params) (measure, error)
}

// cluster is a running cluster of one system.
type cluster interface {
	Members() int
	// Leader waits until every running member names the same running
	// leader and returns its index.
	Leader(ctx context.Context) (int, error)
	// NewLocker opens a session (a lease) through member i, on the
	// cluster's client path.
	NewLocker(ctx context.Context, member int) (locker, error)
	// AttemptTimeout is how long one lock attempt may take during a
	// failover before the client gives up and retries (0: the system's
	// client retries across leader changes by itself).
	AttemptTimeout() time.Duration
	// Stop stops member i the way a crash does; Shutdown stops it the
	// way an operator does (a leader hands leadership over first);
	// Restart starts it again on the same data.
	Stop(member int) error
	Shutdown(member int) error
	// LogSyncs sums the synced log writes of every member so far, from
	// the system's own metrics.
	LogSyncs() logSyncs
	Restart(ctx context.Context, member int) error
	Close() error
}

// locker is a client with its own session.
type locker interface {
	// Lock blocks until name is held and returns the function releasing it.
	Lock(ctx context.Context, name string) (unlock func(context.Context) error, err error)
	Close(ctx context.Context) error
}

// measure is one system's result for a scenario.
type measure struct {
	value float64
	extra map[string]any
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	// Every listener stays open until all ports are picked: one closed at
	// once could be handed out again by the next Listen.
	out := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// parallel runs f(i) for i in [0, n) on workers goroutines. It stops
// handing out work at the first error or when ctx ends, and returns the
// first error.
func parallel(ctx context.Context, n, workers int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		errOnce  sync.Once
		firstErr error
		wg       sync.WaitGroup
	)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(ctx, i); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("item %d: %w", i, err) })
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// progress reports a phase's progress on stderr at most every 5 s.
type progress struct {
	what  string
	total int
	start time.Time
	done  atomic.Int64
	last  atomic.Int64 // unix nanos of the last report
}

func newProgress(what string, total int) *progress {
	p := &progress{what: what, total: total, start: time.Now()}
	p.last.Store(p.start.UnixNano())
	return p
}

func (p *progress) add(n int) {
	d := p.done.Add(int64(n))
	now := time.Now().UnixNano()
	if last := p.last.Load(); now-last > int64(5*time.Second) && p.last.CompareAndSwap(last, now) {
		logf("  %s: %d/%d (%.0f/s)", p.what, d, p.total, float64(d)/time.Since(p.start).Seconds())
	}
}

func (p *progress) finish() time.Duration {
	el := time.Since(p.start)
	logf("  %s: %d in %v (%.0f/s)", p.what, p.done.Load(), el.Round(time.Millisecond), float64(p.done.Load())/el.Seconds())
	return el
}

// logSyncs counts synced log writes (each one fsync) and their total time,
// summed over the members, from a latency histogram of the system's own.
type logSyncs struct {
	count   uint64
	seconds float64
}

func (l logSyncs) since(earlier logSyncs) logSyncs {
	return logSyncs{count: l.count - earlier.count, seconds: l.seconds - earlier.seconds}
}

// gatherLogSyncs sums the histogram named name over every metric g gathers
// (each member's, where members have their own).
func gatherLogSyncs(g prometheus.Gatherer, name string) logSyncs {
	var out logSyncs
	mfs, err := g.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			out.count += m.GetHistogram().GetSampleCount()
			out.seconds += m.GetHistogram().GetSampleSum()
		}
	}
	return out
}
