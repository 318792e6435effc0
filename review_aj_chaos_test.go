package quorumlock_test

// Review AJ: the contended-lock path (deferred blocking acquires, hand-off,
// held commit notices) under leader faults, black-box through the public
// API and internal/testcluster.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
	"github.com/quorumlock/quorumlock/internal/testhook"
)

// ajCS watches one lock's critical section from the holders' side: no
// grant may be admitted while another holder's Lost is still open, and
// every holder whose Lost is open must pass the fence.
type ajCS struct {
	name  string
	fence *quorumlock.Fence

	mu         sync.Mutex
	cur        *quorumlock.Lock
	maxToken   quorumlock.Token
	grants     int
	violations []string
}

func newAJCS(name string) *ajCS { return &ajCS{name: name, fence: quorumlock.NewFence()} }

func (c *ajCS) violate(format string, args ...any) {
	c.violations = append(c.violations, fmt.Sprintf(format, args...))
}

// enter is called by the holder of l right after its Acquire returned.
func (c *ajCS) enter(l *quorumlock.Lock) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.grants++
	if p := c.cur; p != nil && p != l && !closed(p.Lost()) && !closed(l.Lost()) {
		c.violate("session %d granted %q with token %d while session %d holds it with token %d (its Lost still open)",
			l.Session().ID(), c.name, l.Token(), p.Session().ID(), p.Token())
	}
	// Each enter is a new grant (a worker holds one at a time): its token
	// must be above every earlier grant's.
	if l.Token() <= c.maxToken && !closed(l.Lost()) {
		c.violate("session %d granted %q with token %d, not above the earlier grant's %d",
			l.Session().ID(), c.name, l.Token(), c.maxToken)
	}
	c.maxToken = max(c.maxToken, l.Token())
	if err := c.fence.Admit(c.name, l.Token()); err != nil && !closed(l.Lost()) {
		c.violate("session %d holds %q with token %d (Lost open) but the fence refuses it: %v",
			l.Session().ID(), c.name, l.Token(), err)
	}
	c.cur = l
}

// exit is called by the holder before it releases.
func (c *ajCS) exit(l *quorumlock.Lock) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == l {
		c.cur = nil
	}
}

func (c *ajCS) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, v := range c.violations {
		if i >= 20 {
			t.Errorf("... and %d more", len(c.violations)-20)
			break
		}
		t.Error(v)
	}
}

// ajErrs counts errors by kind, for the log.
type ajErrs struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *ajErrs) add(what string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	s := err.Error()
	if len(s) > 90 {
		s = s[:90]
	}
	e.n[what+": "+s]++
}

func (e *ajErrs) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for k, v := range e.n {
		out = append(out, fmt.Sprintf("%dx %s", v, k))
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// ajWorker loops Acquire/hold/Release of name on sessions opened through
// open (a replica's or a client's NewSession), opening a new session when
// one ends. healthy reports whether faults are over: from then on any
// error fails the test.
type ajWorker struct {
	id       int
	open     func(ctx context.Context) (*quorumlock.Session, error)
	cycles   atomic.Int64
	lastDone atomic.Int64 // unix nanos of the last completed cycle
}

func (w *ajWorker) run(t *testing.T, cs *ajCS, errs *ajErrs, stop <-chan struct{}, healthy *atomic.Bool, hold time.Duration) {
	var s *quorumlock.Session
	defer func() {
		if s != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			s.Close(ctx)
			cancel()
		}
	}()
	for {
		select {
		case <-stop:
			return
		default:
		}
		if s == nil || closed(s.Done()) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			ns, err := w.open(ctx)
			cancel()
			if err != nil {
				if healthy.Load() {
					t.Errorf("worker %d: NewSession after the faults: %v", w.id, err)
				}
				errs.add("NewSession", err)
				time.Sleep(50 * time.Millisecond)
				continue
			}
			s = ns
		}
		wasHealthy := healthy.Load()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		start := time.Now()
		l, err := s.Acquire(ctx, cs.name)
		if err != nil {
			cancel()
			errs.add("Acquire", err)
			if errors.Is(err, context.DeadlineExceeded) {
				t.Logf("worker %d session %d (done %v, err %v): Acquire started %s ran out after %v: %v",
					w.id, s.ID(), closed(s.Done()), s.Err(), start.Format("15:04:05.000"), time.Since(start), err)
			}
			if wasHealthy {
				t.Errorf("worker %d session %d: Acquire after the faults (took %v): %v", w.id, s.ID(), time.Since(start), err)
			}
			continue
		}
		cs.enter(l)
		time.Sleep(hold)
		cs.exit(l)
		if err := l.Release(ctx); err != nil {
			errs.add("Release", err)
			if wasHealthy {
				t.Errorf("worker %d session %d: Release after the faults: %v", w.id, s.ID(), err)
			}
		}
		cancel()
		w.cycles.Add(1)
		w.lastDone.Store(time.Now().UnixNano())
	}
}

// ajNemesis is one fault of the current leader: start begins it and
// returns how to end it. It is skipped while there is no leader.
type ajNemesis struct {
	name  string
	start func(c *testcluster.Cluster, leader uint64) (heal func())
}

// run starts n against c's leader, if any, and returns how to end it.
func (n ajNemesis) run(c *testcluster.Cluster) (heal func()) {
	ld := c.Leader()
	if ld == 0 {
		return func() {}
	}
	return n.start(c, ld)
}

func ajNemeses() []ajNemesis {
	return []ajNemesis{
		{"hard-close leader", func(c *testcluster.Cluster, ld uint64) func() {
			c.Stop(ld)
			return func() { c.Restart(ld) }
		}},
		{"isolate leader", func(c *testcluster.Cluster, ld uint64) func() {
			c.Isolate(ld)
			return c.Heal
		}},
		{"transfer leadership", func(c *testcluster.Cluster, ld uint64) func() {
			testhook.TransferLeadership(c.Node(ld), follower(c, ld))
			return func() {}
		}},
		{"graceful close leader", func(c *testcluster.Cluster, ld uint64) func() {
			c.Close(ld)
			return func() { c.Restart(ld) }
		}},
		{"lossy+slow links from leader", func(c *testcluster.Cluster, ld uint64) func() {
			for _, id := range c.IDs() {
				if id != ld {
					c.Delay(ld, id, 3*time.Millisecond)
					c.Drop(id, ld, 0.05)
				}
			}
			return c.Heal
		}},
	}
}

// TestReviewAJContendedUnderLeaderFaults: 12 sessions (on replicas and on
// remote clients) loop Acquire/Release of one name while the nemesis kills,
// isolates, closes and transfers the leader and makes its links lossy.
// Never two holders with open Lost channels, the fence always admits a
// holder whose Lost is open, and once the faults are over every worker
// keeps completing cycles without errors.
func TestReviewAJContendedUnderLeaderFaults(t *testing.T) {
	for _, tick := range []time.Duration{10 * time.Millisecond, 100 * time.Millisecond} {
		t.Run(fmt.Sprintf("tick=%v", tick), func(t *testing.T) {
			ajContendedUnderLeaderFaults(t, tick, 12*time.Second)
		})
	}
}

func ajContendedUnderLeaderFaults(t *testing.T, tick time.Duration, faultFor time.Duration) {
	c := testcluster.New(t, testcluster.Options{Size: 3, TickInterval: tick, SessionTTL: 5 * time.Second})
	c.WaitLeader(10 * time.Second)
	var clients []*quorumlock.Client
	for i := range 2 {
		clients = append(clients, dial(t, addrsOf(c, c.IDs()...),
			quorumlock.WithDialer(c.Net.Dialer(uint64(100+i))),
			quorumlock.WithSessionTTL(5*time.Second),
			quorumlock.WithElectionTimeout(c.ElectionTimeout())))
	}
	var workers []*ajWorker
	for i := range 12 {
		w := &ajWorker{id: i}
		switch {
		case i < 8:
			id := c.IDs()[i%3]
			w.open = func(ctx context.Context) (*quorumlock.Session, error) {
				n := c.Node(id)
				if n == nil {
					return nil, errors.New("replica stopped")
				}
				return n.NewSession(ctx)
			}
		default:
			cl := clients[i%2]
			w.open = func(ctx context.Context) (*quorumlock.Session, error) { return cl.NewSession(ctx) }
		}
		workers = append(workers, w)
	}
	cs := newAJCS("hot")
	var errs ajErrs
	var healthy atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { w.run(t, cs, &errs, stop, &healthy, time.Millisecond) })
	}

	rnd := rand.New(rand.NewPCG(uint64(tick), 42))
	nem := ajNemeses()
	deadline := time.Now().Add(faultFor)
	for i := 0; time.Now().Before(deadline); i++ {
		time.Sleep(time.Duration(300+rnd.IntN(700)) * time.Millisecond)
		f := nem[i%len(nem)]
		heal := f.run(c)
		time.Sleep(time.Duration(200+rnd.IntN(800)) * time.Millisecond)
		heal()
		t.Logf("%s %v: %s, then healed", time.Now().Format("15:04:05.000"), time.Until(deadline).Round(time.Millisecond), f.name)
		c.WaitLeader(10 * time.Second)
	}
	c.Heal()
	// Let sessions of stopped replicas end and stale waits settle: one
	// TTL, plus a little.
	time.Sleep(6 * time.Second)
	before := make([]int64, len(workers))
	for i, w := range workers {
		before[i] = w.cycles.Load()
	}
	healthy.Store(true)
	time.Sleep(8 * time.Second)
	for i, w := range workers {
		if got := w.cycles.Load() - before[i]; got < 2 {
			t.Errorf("worker %d completed %d cycles in 8 s after the faults (last cycle %v ago)",
				i, got, time.Since(time.Unix(0, w.lastDone.Load())).Round(time.Millisecond))
		}
	}
	close(stop)
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		t.Fatal("workers still running 30 s after stop")
	}
	cs.check(t)
	t.Logf("grants: %d; errors:\n%s", cs.grants, errs.String())
	ld := c.WaitLeader(10 * time.Second)
	if info, free := waitFree(t, c.Node(ld), "hot", 10*time.Second); !free {
		t.Fatalf("lock not free after every session closed: %+v", info)
	}
}
