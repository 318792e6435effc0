package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
	"github.com/quorumlock/quorumlock/internal/testhook"
)

// ClusterOptions configure a real in-process cluster.
type ClusterOptions struct {
	Size          int           // replicas: 3 or 5
	Clients       int           // remote clients (quorumlock.Dial)
	Tick          time.Duration // raft tick
	ElectionTicks int
	TTL           time.Duration // session TTL
	Seed          uint64        // the network's random drops
	Dir           string        // data directories and the replica log
}

// clientBase is the network ID of remote client 0.
const clientBase = 100

// errDown is returned by an endpoint whose process is stopped.
var errDown = fmt.Errorf("%w: endpoint is down", quorumlock.ErrClosed)

// Cluster is a System over internal/testcluster: real replicas (raft,
// Pebble, gRPC) on loopback with fault-injecting links, plus remote clients
// that reach them through quorumlock.Dial over the same faulty network.
type Cluster struct {
	opts ClusterOptions
	t    *tb
	c    *testcluster.Cluster
	logf *os.File

	mu       sync.Mutex
	clients  []*quorumlock.Client
	admin    *quorumlock.Client
	probes   map[*quorumlock.Node]*quorumlock.Session
	probeIDs map[uint64]bool
	probeN   int
	clocks   map[string]*pausableClock // by endpoint name: r<id>, c<i>
}

// NewCluster starts a cluster and its clients and waits for a leader.
func NewCluster(opts ClusterOptions) (_ *Cluster, err error) {
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(opts.Dir, "replicas.log"))
	if err != nil {
		return nil, err
	}
	level := zap.InfoLevel
	if os.Getenv("VERIFY_DEBUG") != "" {
		level = zap.DebugLevel
	}
	logger := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.AddSync(logf), level))
	c := &Cluster{opts: opts, logf: logf, t: newTB(opts.Dir, nil), probes: map[*quorumlock.Node]*quorumlock.Session{}, probeIDs: map[uint64]bool{}, clocks: map[string]*pausableClock{}}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := guard(func() {
		c.c = testcluster.New(c.t, testcluster.Options{
			Size:          opts.Size,
			TickInterval:  opts.Tick,
			ElectionTicks: opts.ElectionTicks,
			SessionTTL:    opts.TTL,
			Seed:          opts.Seed,
			Configure: func(cfg *quorumlock.Config) {
				cfg.Logger = logger.Named(fmt.Sprintf("r%d", cfg.ID))
				cfg.Clock = c.clock(fmt.Sprintf("r%d", cfg.ID))
				if b := os.Getenv("VERIFY_BACKEND"); b != "" {
					cfg.LogBackend = quorumlock.LogBackend(b)
				}
				if v := os.Getenv("VERIFY_SNAPSHOT_ENTRIES"); v != "" {
					n, _ := strconv.ParseUint(v, 10, 64)
					cfg.SnapshotEntries = n
				}
			},
		})
	}); err != nil {
		return nil, err
	}
	if c.WaitLeader(10*time.Second) == 0 {
		return nil, errors.New("no leader after start")
	}
	for i := range opts.Clients {
		cl, err := c.dial(clientBase + uint64(i))
		if err != nil {
			return nil, err
		}
		c.clients = append(c.clients, cl)
	}
	if c.admin, err = c.dial(clientBase + 99); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) dial(netID uint64) (*quorumlock.Client, error) {
	var addrs []string
	for _, id := range c.c.IDs() {
		addrs = append(addrs, c.c.Peers()[id])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts := []quorumlock.ClientOption{
		quorumlock.WithSessionTTL(c.opts.TTL),
		quorumlock.WithElectionTimeout(c.ElectionTimeout()),
		quorumlock.WithDialer(c.c.Net.Dialer(netID)),
	}
	if i := netID - clientBase; i < uint64(c.opts.Clients) {
		// The workload's clients can be paused; the harness's own (admin)
		// cannot.
		opts = append(opts, quorumlock.WithClock(c.clock(fmt.Sprintf("c%d", i))))
	}
	return quorumlock.Dial(ctx, addrs, opts...)
}

// clock returns the pausable clock of the process named name (an
// endpoint's name), the same one across restarts and redials.
func (c *Cluster) clock(name string) *pausableClock {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.clocks[name]
	if p == nil {
		p = &pausableClock{}
		c.clocks[name] = p
	}
	return p
}

// netID returns the network ID of the process named name (r<id> or c<i>).
func (c *Cluster) netID(name string) (uint64, bool) {
	var id uint64
	if _, err := fmt.Sscanf(name, "r%d", &id); err == nil && contains(c.c.IDs(), id) {
		return id, true
	}
	if _, err := fmt.Sscanf(name, "c%d", &id); err == nil && id < uint64(c.opts.Clients) {
		return clientBase + id, true
	}
	return 0, false
}

// Pause implements Pauser: the process named name (a replica r<id> or a
// remote client c<i>) is frozen as by SIGSTOP: its clock stops (no raft
// tick, no session or lease timer), every link to and from it stalls both
// ways (nothing it sends arrives, nothing sent to it is read, new
// connections fail), and the workload's clients in it stop at their next
// fenced write, after checking their lease (Gate); their other calls
// stall on the links. Resume undoes it (SIGCONT).
func (c *Cluster) Pause(name string) error {
	id, ok := c.netID(name)
	if !ok {
		return fmt.Errorf("pause: no process %q", name)
	}
	c.clock(name).freeze()
	others := append(c.c.IDs(), c.Clients()...)
	others = append(others, clientBase+99) // the harness's admin client
	for _, o := range others {
		if o != id {
			c.c.Net.Cut(id, o)
			c.c.Net.Cut(o, id)
		}
	}
	return nil
}

// Resume implements Pauser: the links heal (every fault of the network is
// lifted) and the clock of the process runs again; its due timers fire
// late, all at once.
func (c *Cluster) Resume(name string) {
	c.c.Heal()
	c.clock(name).thaw()
}

// How implements Pauser.
func (c *Cluster) How(string) string { return "SIGSTOP emulated in process" }

// Gate implements Pauser.
func (c *Cluster) Gate(name string) { c.clock(name).gate() }

// Held implements Pauser.
func (c *Cluster) Held(name string) int64 { return c.clock(name).held.Load() }

// View implements Pauser: the leader replica id believes in (0: none, or
// the replica is stopped).
func (c *Cluster) View(id uint64) uint64 {
	n := c.c.Node(id)
	if n == nil {
		return 0
	}
	return n.Status().Leader
}

// TransferLeader implements Transferrer: it asks replica from to hand
// leadership to replica to with raft's leadership transfer, without
// stopping it.
func (c *Cluster) TransferLeader(from, to uint64) bool {
	n := c.c.Node(from)
	return n != nil && testhook.TransferLeadership(n, to)
}

// Endpoints implements System.
func (c *Cluster) Endpoints() []Endpoint {
	var out []Endpoint
	for _, id := range c.c.IDs() {
		out = append(out, replicaEndpoint{c, id})
	}
	for i := range c.opts.Clients {
		out = append(out, clientEndpoint{c, i})
	}
	return out
}

// Members implements System.
func (c *Cluster) Members() []uint64 { return c.c.IDs() }

// Clients implements System.
func (c *Cluster) Clients() []uint64 {
	var out []uint64
	for i := range c.opts.Clients {
		out = append(out, clientBase+uint64(i))
	}
	return out
}

// Leader implements System.
func (c *Cluster) Leader() uint64 { return c.c.Leader() }

// WaitLeader implements System.
func (c *Cluster) WaitLeader(d time.Duration) uint64 {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if l := c.c.Leader(); l != 0 {
			return l
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0
}

// ElectionTimeout implements System.
func (c *Cluster) ElectionTimeout() time.Duration { return c.c.ElectionTimeout() }

// Isolate implements System.
func (c *Cluster) Isolate(id uint64) { c.c.Isolate(id) }

// Partition implements System.
func (c *Cluster) Partition(groups ...[]uint64) { c.c.Net.Partition(groups...) }

// Cut implements System.
func (c *Cluster) Cut(from, to uint64) { c.c.Net.Cut(from, to) }

// SetDelay implements System.
func (c *Cluster) SetDelay(from, to uint64, d time.Duration) { c.c.Net.SetDelay(from, to, d) }

// SetDrop implements System.
func (c *Cluster) SetDrop(from, to uint64, p float64) { c.c.Net.SetDrop(from, to, p) }

// Heal implements System.
func (c *Cluster) Heal() { c.c.Heal() }

// Stop implements System.
func (c *Cluster) Stop(id uint64) { c.c.Stop(id) }

// Shutdown implements System.
func (c *Cluster) Shutdown(id uint64) { c.c.Close(id) }

// Restart implements System.
func (c *Cluster) Restart(id uint64) error {
	if c.c.Node(id) != nil {
		return nil
	}
	return guard(func() { c.c.Restart(id) })
}

// Running implements System.
func (c *Cluster) Running() []uint64 { return c.c.Running() }

// CrashClient implements System.
func (c *Cluster) CrashClient(i int) error {
	c.mu.Lock()
	old := c.clients[i]
	c.mu.Unlock()
	old.Close()
	cl, err := c.dial(clientBase + uint64(i))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.clients[i] = cl
	c.mu.Unlock()
	return nil
}

func (c *Cluster) client(i int) *quorumlock.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clients[i]
}

// Probe implements System: TryAcquire of a fresh lock name by a session on
// a running replica not in avoid (opened if needed), then a release in the
// background.
func (c *Cluster) Probe(ctx context.Context, avoid []uint64) error {
	var n *quorumlock.Node
	for _, id := range c.c.Running() {
		if !contains(avoid, id) {
			if n = c.c.Node(id); n != nil {
				break
			}
		}
	}
	if n == nil {
		return errDown
	}
	c.mu.Lock()
	s := c.probes[n]
	c.probeN++
	name := fmt.Sprintf("probe-%d", c.probeN)
	c.mu.Unlock()
	if s == nil || s.Err() != nil {
		var err error
		if s, err = n.NewSession(ctx); err != nil {
			return err
		}
		c.mu.Lock()
		c.probes[n] = s
		c.probeIDs[s.ID()] = true
		c.mu.Unlock()
	}
	return tryThenRelease(ctx, s, name)
}

// PrepareProbes opens a fresh probe session on every running replica (the
// old ones are closed), so that a measurement neither includes opening one
// nor loses one whose lease is about to run out.
func (c *Cluster) PrepareProbes(ctx context.Context) {
	for _, id := range c.c.Running() {
		n := c.c.Node(id)
		if n == nil {
			continue
		}
		s, err := n.NewSession(ctx)
		if err != nil {
			continue
		}
		c.mu.Lock()
		old := c.probes[n]
		c.probes[n] = s
		c.probeIDs[s.ID()] = true
		c.mu.Unlock()
		if old != nil {
			go func() {
				cctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				old.Close(cctx)
			}()
		}
	}
}

// LiveSessions implements System.
func (c *Cluster) LiveSessions(ctx context.Context) (map[uint64]bool, error) {
	return liveSessions(ctx, c.admin, func(id uint64) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.probeIDs[id]
	})
}

// Read implements System.
func (c *Cluster) Read(ctx context.Context, name string) (Info, error) {
	return readHolder(ctx, c.admin, name)
}

// Close implements System.
func (c *Cluster) Close() {
	c.mu.Lock()
	clients := append([]*quorumlock.Client{c.admin}, c.clients...)
	c.mu.Unlock()
	for _, cl := range clients {
		if cl != nil {
			cl.Close()
		}
	}
	guard(c.t.runCleanups)
	c.logf.Close()
}

// replicaEndpoint hosts sessions on replica id (quorumlock.Node).
type replicaEndpoint struct {
	c  *Cluster
	id uint64
}

func (e replicaEndpoint) Name() string { return fmt.Sprintf("r%d", e.id) }

func (e replicaEndpoint) NewSession(ctx context.Context) (Session, error) {
	n := e.c.c.Node(e.id)
	if n == nil {
		return nil, errDown
	}
	s, err := n.NewSession(ctx)
	if err != nil {
		return nil, err
	}
	return qlSession{s}, nil
}

func (e replicaEndpoint) Holder(ctx context.Context, name string) (Info, error) {
	n := e.c.c.Node(e.id)
	if n == nil {
		return Info{}, errDown
	}
	li, err := n.Holder(ctx, name)
	return Info{Holder: li.Holder, Token: uint64(li.Token), Waiters: li.Waiters}, err
}

// clientEndpoint hosts sessions on remote client i (quorumlock.Client).
type clientEndpoint struct {
	c *Cluster
	i int
}

func (e clientEndpoint) Name() string { return fmt.Sprintf("c%d", e.i) }

func (e clientEndpoint) NewSession(ctx context.Context) (Session, error) {
	s, err := e.c.client(e.i).NewSession(ctx)
	if err != nil {
		return nil, err
	}
	return qlSession{s}, nil
}

func (e clientEndpoint) Holder(ctx context.Context, name string) (Info, error) {
	li, err := e.c.client(e.i).Holder(ctx, name)
	return Info{Holder: li.Holder, Token: uint64(li.Token), Waiters: li.Waiters}, err
}

// qlSession and qlLock adapt quorumlock's types to Session and Lock.
type qlSession struct{ *quorumlock.Session }

func (s qlSession) Acquire(ctx context.Context, name string) (Lock, error) {
	l, err := s.Session.Acquire(ctx, name)
	if err != nil {
		return nil, err
	}
	return qlLock{l}, nil
}

func (s qlSession) TryAcquire(ctx context.Context, name string) (Lock, error) {
	l, err := s.Session.TryAcquire(ctx, name)
	if err != nil {
		return nil, err
	}
	return qlLock{l}, nil
}

type qlLock struct{ *quorumlock.Lock }

func (l qlLock) Token() uint64 { return uint64(l.Lock.Token()) }

func contains(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func without(ids []uint64, id uint64) []uint64 {
	var out []uint64
	for _, x := range ids {
		if x != id {
			out = append(out, x)
		}
	}
	return out
}
