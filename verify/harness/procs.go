package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/proctest"
)

// ProcFaults are the fault kinds a multi-process trial (Procs) can inject:
// there is no fault network between lockd processes, so the network faults
// (isolate-leader, one-way-cut, partition, delay-drop, leader-churn) and
// leader-transfer are not available.
var ProcFaults = []string{KillMinority, RestartAll, LeaderHandoff, ClientCrash, PauseLeader, PauseHolder, CrashPoint}

// CrashPoint makes a replica (the leader half of the time) kill itself
// with SIGKILL at a point of its raft Ready loop (before-save, after-save,
// after-send, after-apply: raftnode's failpoints), the n-th time it passes
// it from now on; it is restarted on its data when the step ends. Only
// multi-process trials can inject it (a lockd built with the tag
// crashpoint).
const CrashPoint = "crash-point"

// ReadyPoints are the Ready-loop points CrashPoint draws from.
var ReadyPoints = []string{"before-save", "after-save", "after-send", "after-apply"}

// Crasher is a System whose replicas can be made to crash at a Ready-loop
// point (Procs).
type Crasher interface {
	// ArmCrash makes replica id kill itself the n-th time it passes point.
	ArmCrash(id uint64, point string, n int) error
}

// LockdPackage is the import path of the replica program a multi-process
// trial runs.
const LockdPackage = "github.com/quorumlock/quorumlock/examples/lockd"

// Procs is a System of separate lockd processes on loopback
// (internal/proctest), reached by remote clients (quorumlock.Dial) in the
// harness's process: kill-minority and restart-all send SIGKILL, a
// leader hand-off SIGTERM (lockd closes its Node: it hands leadership
// over), pause-leader SIGSTOP and SIGCONT. A paused holder is one of the
// remote clients, paused in process (its clock and its workers; its
// links cannot be stalled).
type Procs struct {
	opts ClusterOptions
	t    *tb
	c    *proctest.Cluster

	mu       sync.Mutex
	clients  []*quorumlock.Client
	admin    *quorumlock.Client
	probes   map[string]*quorumlock.Session // by the probe client's addresses
	probeCl  map[string]*quorumlock.Client
	probeIDs map[uint64]bool
	probeN   int
	clocks   map[string]*pausableClock // c<i>
}

// NewProcs starts opts.Size lockd processes (the binary bin, see
// proctest.Build) and opts.Clients remote clients, and waits for a leader.
func NewProcs(bin string, opts ClusterOptions) (_ *Procs, err error) {
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	p := &Procs{opts: opts, t: newTB(opts.Dir, nil), probes: map[string]*quorumlock.Session{}, probeCl: map[string]*quorumlock.Client{},
		probeIDs: map[uint64]bool{}, clocks: map[string]*pausableClock{}}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	if err := guard(func() {
		p.c = proctest.NewCluster(p.t, bin, proctest.Options{Size: opts.Size, TTL: opts.TTL, Tick: opts.Tick, ElectionTicks: opts.ElectionTicks,
			Env: func(id uint64) []string { return []string{"QUORUMLOCK_CRASH_FILE=" + p.crashFile(id)} }})
	}); err != nil {
		return nil, err
	}
	if p.WaitLeader(10*time.Second) == 0 {
		return nil, errors.New("no leader after start")
	}
	for i := range opts.Clients {
		cl, err := p.dial(p.c.Addrs(p.c.IDs()...), p.clock(fmt.Sprintf("c%d", i)))
		if err != nil {
			return nil, err
		}
		p.clients = append(p.clients, cl)
	}
	if p.admin, err = p.dial(p.c.Addrs(p.c.IDs()...), nil); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Procs) dial(addrs []string, clk *pausableClock) (*quorumlock.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts := p.c.ClientOptions()
	if clk != nil {
		opts = append(opts, quorumlock.WithClock(clk))
	}
	return quorumlock.Dial(ctx, addrs, opts...)
}

func (p *Procs) clock(name string) *pausableClock {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.clocks[name]
	if c == nil {
		c = &pausableClock{}
		p.clocks[name] = c
	}
	return c
}

func (p *Procs) client(i int) *quorumlock.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.clients[i]
}

// Endpoints implements System: the remote clients (no replica hosts the
// workload's sessions in process).
func (p *Procs) Endpoints() []Endpoint {
	var out []Endpoint
	for i := range p.opts.Clients {
		out = append(out, procEndpoint{p, i})
	}
	return out
}

// Members implements System.
func (p *Procs) Members() []uint64 { return p.c.IDs() }

// Clients implements System: none can be put in a partition.
func (p *Procs) Clients() []uint64 { return nil }

// Leader implements System: the replica that leads with the support of a
// majority of the running ones, or 0.
func (p *Procs) Leader() uint64 {
	sts := p.c.Status(300 * time.Millisecond)
	for id, st := range sts {
		if st.Leader != id {
			continue
		}
		votes := 0
		for _, o := range sts {
			if o.Leader == id && o.Term == st.Term {
				votes++
			}
		}
		if votes > len(p.c.IDs())/2 {
			return id
		}
	}
	return 0
}

// WaitLeader implements System.
func (p *Procs) WaitLeader(d time.Duration) uint64 {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if l := p.Leader(); l != 0 {
			return l
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0
}

// ElectionTimeout implements System.
func (p *Procs) ElectionTimeout() time.Duration {
	return time.Duration(p.opts.ElectionTicks) * p.opts.Tick
}

// The network faults are not available between processes; Run refuses the
// fault kinds that use them (ProcFaults).
func (p *Procs) Isolate(uint64)                         {}
func (p *Procs) Partition(...[]uint64)                  {}
func (p *Procs) Cut(uint64, uint64)                     {}
func (p *Procs) SetDelay(uint64, uint64, time.Duration) {}
func (p *Procs) SetDrop(uint64, uint64, float64)        {}
func (p *Procs) Heal()                                  {}

// Stop implements System: SIGKILL.
func (p *Procs) Stop(id uint64) {
	if err := guard(func() { p.c.Kill(id) }); err != nil {
		p.t.Errorf("kill %d: %v", id, err)
	}
}

// Shutdown implements System: SIGTERM (lockd closes its Node, handing
// leadership over).
func (p *Procs) Shutdown(id uint64) {
	if err := guard(func() { p.c.Terminate(id, 10*time.Second) }); err != nil {
		p.t.Errorf("terminate %d: %v", id, err)
	}
}

// Restart implements System: a new lockd process on the same data.
func (p *Procs) Restart(id uint64) error {
	if p.c.Running(id) {
		return nil
	}
	return guard(func() { p.c.Start(id) })
}

// Running implements System.
func (p *Procs) Running() []uint64 {
	var out []uint64
	for _, id := range p.c.IDs() {
		if p.c.Running(id) {
			out = append(out, id)
		}
	}
	return out
}

// CrashClient implements System.
func (p *Procs) CrashClient(i int) error {
	p.client(i).Close()
	cl, err := p.dial(p.c.Addrs(p.c.IDs()...), p.clock(fmt.Sprintf("c%d", i)))
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.clients[i] = cl
	p.mu.Unlock()
	return nil
}

// Probe implements System: a TryAcquire of a fresh name through a client
// that knows only the replicas not in avoid.
func (p *Procs) Probe(ctx context.Context, avoid []uint64) error {
	var ids []uint64
	for _, id := range p.c.IDs() {
		if !contains(avoid, id) {
			ids = append(ids, id)
		}
	}
	addrs := p.c.Addrs(ids...)
	key := strings.Join(addrs, ",")
	p.mu.Lock()
	cl, s := p.probeCl[key], p.probes[key]
	p.probeN++
	name := fmt.Sprintf("probe-%d", p.probeN)
	p.mu.Unlock()
	if cl == nil {
		var err error
		if cl, err = p.dial(addrs, nil); err != nil {
			return err
		}
		p.mu.Lock()
		p.probeCl[key] = cl
		p.mu.Unlock()
	}
	if s == nil || s.Err() != nil {
		var err error
		if s, err = cl.NewSession(ctx); err != nil {
			return err
		}
		p.mu.Lock()
		p.probes[key] = s
		p.probeIDs[s.ID()] = true
		p.mu.Unlock()
	}
	return tryThenRelease(ctx, s, name)
}

// LiveSessions implements System.
func (p *Procs) LiveSessions(ctx context.Context) (map[uint64]bool, error) {
	return liveSessions(ctx, p.admin, func(id uint64) bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.probeIDs[id]
	})
}

// Read implements System.
func (p *Procs) Read(ctx context.Context, name string) (Info, error) {
	return readHolder(ctx, p.admin, name)
}

// Pause implements Pauser: SIGSTOP of replica r<id>; a remote client c<i>
// is paused in process (its clock and its workers).
func (p *Procs) Pause(name string) error {
	var id uint64
	if _, err := fmt.Sscanf(name, "r%d", &id); err == nil && contains(p.c.IDs(), id) {
		return guard(func() { p.c.Pause(id) })
	}
	p.clock(name).freeze()
	return nil
}

// Resume implements Pauser: SIGCONT.
func (p *Procs) Resume(name string) {
	var id uint64
	if _, err := fmt.Sscanf(name, "r%d", &id); err == nil && contains(p.c.IDs(), id) {
		if err := guard(func() { p.c.Resume(id) }); err != nil {
			p.t.Errorf("resume %d: %v", id, err)
		}
		return
	}
	p.clock(name).thaw()
}

// crashFile is where ArmCrash tells replica id its crash point.
func (p *Procs) crashFile(id uint64) string {
	return filepath.Join(p.opts.Dir, fmt.Sprintf("crash-at-%d", id))
}

// ArmCrash implements Crasher: it writes "point:n" to the replica's crash
// file and sends it SIGUSR1 (examples/lockd/crashpoint.go). A replica
// restarted after the crash is not armed: only the signal arms one.
func (p *Procs) ArmCrash(id uint64, point string, n int) error {
	f := p.crashFile(id)
	if err := os.WriteFile(f, []byte(fmt.Sprintf("%s:%d\n", point, n)), 0o644); err != nil {
		return err
	}
	var err error
	if gerr := guard(func() { err = p.c.Signal(id, syscall.SIGUSR1) }); gerr != nil {
		err = gerr
	}
	return err
}

// How implements Pauser.
func (p *Procs) How(name string) string {
	if strings.HasPrefix(name, "r") {
		return "SIGSTOP"
	}
	return "SIGSTOP emulated in process"
}

// Gate implements Pauser.
func (p *Procs) Gate(name string) { p.clock(name).gate() }

// Held implements Pauser.
func (p *Procs) Held(name string) int64 { return p.clock(name).held.Load() }

// View implements Pauser: the leader replica id names (0 if it does not
// answer: a stopped process answers nothing).
func (p *Procs) View(id uint64) uint64 {
	if st, ok := p.c.Status(300 * time.Millisecond)[id]; ok {
		return st.Leader
	}
	return 0
}

// Close implements System: every process is killed; the replicas' logs
// are copied into the work directory's replicas.log.
func (p *Procs) Close() {
	p.mu.Lock()
	clients := append([]*quorumlock.Client{p.admin}, p.clients...)
	for _, cl := range p.probeCl {
		clients = append(clients, cl)
	}
	p.mu.Unlock()
	for _, cl := range clients {
		if cl != nil {
			cl.Close()
		}
	}
	guard(p.t.runCleanups)
	if p.c != nil {
		var b strings.Builder
		ids := p.c.IDs()
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		for _, id := range ids {
			log, _ := os.ReadFile(p.c.LogFile(id))
			fmt.Fprintf(&b, "--- lockd %d ---\n%s", id, log)
		}
		os.WriteFile(filepath.Join(p.opts.Dir, "replicas.log"), []byte(b.String()), 0o644)
	}
}

// procEndpoint hosts sessions on remote client i of a Procs.
type procEndpoint struct {
	p *Procs
	i int
}

func (e procEndpoint) Name() string { return fmt.Sprintf("c%d", e.i) }

func (e procEndpoint) NewSession(ctx context.Context) (Session, error) {
	s, err := e.p.client(e.i).NewSession(ctx)
	if err != nil {
		return nil, err
	}
	return qlSession{s}, nil
}

func (e procEndpoint) Holder(ctx context.Context, name string) (Info, error) {
	li, err := e.p.client(e.i).Holder(ctx, name)
	return Info{Holder: li.Holder, Token: uint64(li.Token), Waiters: li.Waiters}, err
}

// checkProcFaults returns an error naming the kinds a multi-process trial
// cannot inject.
func checkProcFaults(kinds []string) error {
	var bad []string
	for _, k := range kinds {
		if !slices.Contains(ProcFaults, k) {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("faults %v need the in-process cluster (multi-process trials can inject %v)", bad, ProcFaults)
	}
	return nil
}
