package crashtest

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"

	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/service"
	"github.com/quorumlock/quorumlock/raftnode"
	"github.com/quorumlock/quorumlock/storage/pebblestore"
)

// The cluster runs three replicas in one process. Each is a life of a
// replica: a pebblestore on the replica's crashable MemFS, a raftnode and a
// service.Service as its state machine. Raft ticks come from one manual
// clock that a background goroutine advances; the services get a manual
// clock of their own that never moves, so no session ever expires and every
// change of the lock table comes from the workload.

const (
	testTick      = 100 * time.Millisecond // one raft tick, on the manual clock
	electionTicks = 10
	waitTimeout   = 15 * time.Second // wall-clock bound on every wait
	dataDir       = "data"
)

// replica is one member: its file system outlives each life.
type replica struct {
	id    uint64
	fs    *vfs.MemFS // guarded by cluster.mu
	lives int        // owned by the test goroutine
	cur   *life      // the running life, nil while down; guarded by cluster.mu
}

// life is one run of a replica, from start to crash or test end.
type life struct {
	rep   *replica
	n     int
	store *recStore
	node  *raftnode.Node
	svc   *service.Service
	sm    *recSM
	ep    *endpoint

	inReady bool // between before-save and after-apply; owned by the node goroutine
	// pending is a plan that cut and cloned at this life's before-save and
	// decides at its after-save, armed or not by then; owned by the node
	// goroutine.
	pending *crashPlan
}

type options struct {
	snapshotEntries, catchUpEntries uint64
	// wrapFS, if set, wraps each life's file system (replica id's) before
	// its store opens on it: a test injects storage faults there. The
	// crash images are still taken of the unwrapped file system.
	wrapFS func(id uint64, fs vfs.FS) vfs.FS
}

type cluster struct {
	t      *testing.T
	opt    options
	clk    *stepClock
	svcClk *clock.Manual
	nw     *network
	ids    []uint64
	reps   map[uint64]*replica
	log    *applyLog
	plan   atomic.Pointer[crashPlan]

	mu     sync.Mutex
	lives  []*life // every life ever started
	fatals []string

	stopTicking func()
}

func newCluster(t *testing.T, opt options) *cluster {
	t.Helper()
	c := &cluster{
		t:      t,
		opt:    opt,
		clk:    &stepClock{Manual: clock.NewManual(time.Unix(1_000_000, 0))},
		svcClk: clock.NewManual(time.Unix(1_000_000, 0)),
		nw:     &network{eps: make(map[uint64]*endpoint), cut: make(map[uint64]bool)},
		ids:    []uint64{1, 2, 3},
		reps:   make(map[uint64]*replica),
		log:    newApplyLog(),
	}
	t.Cleanup(c.close)
	for _, id := range c.ids {
		c.reps[id] = &replica{id: id, fs: vfs.NewCrashableMem()}
		c.start(c.reps[id])
	}
	c.stopTicking = c.tickInBackground()
	return c
}

// newNode is raftnode.New, with a panic (raft panics on a hard state it
// cannot load) turned into an error.
func newNode(cfg raftnode.Config) (n *raftnode.Node, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("raftnode.New panicked: %v", p)
		}
	}()
	return raftnode.New(cfg)
}

// start runs a new life of r on r's file system.
func (c *cluster) start(r *replica) {
	c.t.Helper()
	c.mu.Lock()
	fs := r.fs
	c.mu.Unlock()
	r.lives++
	var sfs vfs.FS = fs
	if c.opt.wrapFS != nil {
		sfs = c.opt.wrapFS(r.id, fs)
	}
	st, err := pebblestore.Open(dataDir, pebblestore.Options{FS: sfs})
	if err != nil {
		c.t.Fatalf("replica %d, life %d: opening its store: %v", r.id, r.lives, err)
	}
	l := &life{rep: r, n: r.lives, store: &recStore{Store: st}}
	l.svc = service.New(service.Config{Clock: c.svcClk})
	l.sm = &recSM{Service: l.svc, rep: r.id, life: l.n, log: c.log}
	l.ep = &endpoint{nw: c.nw, id: r.id}
	node, err := newNode(raftnode.Config{
		ID:              r.id,
		Peers:           c.ids,
		Storage:         l.store,
		Transport:       l.ep,
		StateMachine:    l.sm,
		Clock:           c.clk,
		TickInterval:    testTick,
		ElectionTicks:   electionTicks,
		HeartbeatTicks:  1,
		SnapshotEntries: c.opt.snapshotEntries,
		CatchUpEntries:  c.opt.catchUpEntries,
		OnFatal:         func(err error) { c.fatal(r.id, l.n, err) },
		Failpoint:       func(point string) { c.failpoint(l, point) },
	})
	if err != nil {
		state := describe(st)
		_ = st.Close()
		c.t.Fatalf("replica %d, life %d: starting on its store (%s): %v", r.id, l.n, state, err)
	}
	l.node, l.ep.node = node, node
	l.svc.Bind(node)
	go l.svc.Run()
	c.mu.Lock()
	r.cur = l
	c.lives = append(c.lives, l)
	c.mu.Unlock()
	c.nw.attach(l.ep)
	node.Start()
}

func (c *cluster) fatal(id uint64, life int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fatals = append(c.fatals, fmt.Sprintf("replica %d, life %d stopped: %v", id, life, err))
}

// stop ends the running life of each of ids, as a crash does: the replica
// leaves the network first, then its service and node stop. It returns the
// stopped lives' stores' state.
func (c *cluster) stop(ids []uint64, resume func()) map[uint64]string {
	var ls []*life
	for _, id := range ids {
		c.nw.detach(id)
		c.mu.Lock()
		r := c.reps[id]
		if r.cur != nil {
			ls = append(ls, r.cur)
		}
		r.cur = nil
		c.mu.Unlock()
	}
	// Waiters are answered NOT_LEADER before the node goes on: nothing that
	// node does after the crash point reaches a client.
	for _, l := range ls {
		l.svc.Stop()
	}
	if resume != nil {
		resume()
	}
	states := make(map[uint64]string)
	for _, l := range ls {
		l.node.Stop()
		states[l.rep.id] = describe(l.store)
		_ = l.store.Close()
	}
	return states
}

func (c *cluster) close() {
	if p := c.plan.Swap(nil); p != nil {
		p.release()
	}
	c.stop(c.ids, nil)
	if c.stopTicking != nil {
		c.stopTicking()
	}
}

// tickInBackground advances the raft clock a tick per millisecond until
// the returned function is called.
func (c *cluster) tickInBackground() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
				c.clk.tick()
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// running returns the running lives, in ID order.
func (c *cluster) running() []*life {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*life
	for _, id := range c.ids {
		if l := c.reps[id].cur; l != nil {
			out = append(out, l)
		}
	}
	return out
}

// leader returns the running life that is leader of the highest term, or
// nil.
func (c *cluster) leader() *life {
	var lead *life
	var term uint64
	for _, l := range c.running() {
		if st := l.node.Status(); st.State == raft.StateLeader && st.Term > term {
			lead, term = l, st.Term
		}
	}
	return lead
}

// readyLeader returns the leader once every running replica follows it and
// it has applied an entry of its own term (so it has committed everything
// committed before), or nil.
func (c *cluster) readyLeader() *life {
	lead := c.leader()
	if lead == nil {
		return nil
	}
	st := lead.node.Status()
	if lead.sm.ready() != st.Term {
		return nil
	}
	for _, l := range c.running() {
		if s := l.node.Status(); s.Leader != st.ID || s.Term != st.Term {
			return nil
		}
	}
	return lead
}

func (c *cluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after %v waiting for %s", waitTimeout, what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (c *cluster) waitLeader() *life {
	c.t.Helper()
	var lead *life
	c.waitFor("a ready leader", func() bool {
		lead = c.readyLeader()
		return lead != nil
	})
	return lead
}

// quiesce waits until every replica runs, follows a ready leader and has
// applied the leader's commit index, which must cover every index any
// replica ever applied (nothing applied before a crash is forgotten), and
// returns that index.
func (c *cluster) quiesce() uint64 {
	c.t.Helper()
	var commit, top uint64
	var lagging string
	deadline := time.Now().Add(waitTimeout)
	for {
		// Read the highest applied index first: what is applied after this
		// is covered by a later commit index.
		top = c.log.max()
		commit, lagging = 0, "no ready leader"
		if lead := c.readyLeader(); lead != nil {
			commit, lagging = lead.node.Status().Commit, ""
			running := c.running()
			if len(running) != len(c.ids) {
				lagging = "a replica is down"
			}
			for _, l := range running {
				if a := l.node.Status().Applied; a < commit {
					lagging = fmt.Sprintf("replica %d has applied %d", l.rep.id, a)
				}
			}
		}
		if lagging == "" && commit >= top {
			return commit
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("after %v: the leader's commit index is %d (%s), and index %d was applied before",
				waitTimeout, commit, lagging, top)
		}
		time.Sleep(time.Millisecond)
	}
}

// problems returns what the recorders found: entries applied twice
// differently or out of order, and replicas stopped by a storage error.
func (c *cluster) problems() []string {
	out := c.log.errors()
	c.mu.Lock()
	lives := slices.Clone(c.lives)
	out = append(out, c.fatals...)
	c.mu.Unlock()
	for _, l := range lives {
		out = append(out, l.sm.errors()...)
	}
	return out
}
