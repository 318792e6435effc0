package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quorumlock/quorumlock"
)

// Review AG: clusters built the way a user builds them (quorumlock.Start with
// ID, Peers, DataDir and Listener, every other setting at its default: 100 ms
// tick, 1 s election timeout, 10 s TTL), in one process on loopback, under a
// load of sessions and a CPU hog. Nothing here overrides a timing default.

// agCluster starts size replicas with the default timing (specCluster with
// its short tick undone).
func agCluster(t *testing.T, size int) []*quorumlock.Node {
	t.Helper()
	return specCluster(t, size, func(c *quorumlock.Config) {
		c.TickInterval = 0
		c.ElectionTicks = 0
	})
}

// agHog keeps n goroutines spinning until the returned stop is called or d
// has passed, whichever is first; stop waits for them to end.
func agHog(n int, d time.Duration) (stop func()) {
	done := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range n {
		wg.Go(func() {
			x := uint64(1)
			for i := 0; ; i++ {
				x = x*6364136223846793005 + 1442695040888963407
				if i%4096 == 0 {
					select {
					case <-done:
						return
					default:
					}
					if time.Now().After(end) {
						return
					}
				}
			}
		})
	}
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}

// agHogN is how many goroutines the hog spins: two per core, or
// AG_HOGN when set (0 turns the hog off, more loads the machine harder).
func agHogN() int {
	if v, err := strconv.Atoi(os.Getenv("AG_HOGN")); err == nil {
		return v
	}
	return 2 * runtime.GOMAXPROCS(0)
}

// agMaxTerm is the highest raft term among the running nodes.
func agMaxTerm(nodes []*quorumlock.Node, skip map[int]bool) uint64 {
	var m uint64
	for i, n := range nodes {
		if skip[i] {
			continue
		}
		m = max(m, n.Status().Term)
	}
	return m
}

// agLoad runs Acquire/Release loops of the sessions on a few shared names
// until stop closes, and records what a correct lock service must never do:
// two holders at once, a token that does not grow, an error that is not the
// ctx's, a call that returns long after its ctx ended, a lock lost while its
// session lives.
type agLoad struct {
	names   []string
	mu      sync.Mutex
	last    map[string]quorumlock.Token
	lastBy  map[string]string
	inCS    map[string]*atomic.Int32
	fence   *quorumlock.Fence
	grants  atomic.Int64
	timeout atomic.Int64
	// releaseTimeout counts Release calls whose ctx ended first.
	releaseTimeout atomic.Int64
	errs           []string
}

func newAGLoad(names ...string) *agLoad {
	l := &agLoad{names: names, last: map[string]quorumlock.Token{}, lastBy: map[string]string{}, inCS: map[string]*atomic.Int32{}, fence: quorumlock.NewFence()}
	for _, n := range names {
		l.inCS[n] = new(atomic.Int32)
	}
	return l
}

func (a *agLoad) fail(format string, args ...any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.errs) < 20 {
		a.errs = append(a.errs, fmt.Sprintf(format, args...))
	}
}

// run loops on s until stop closes. allowed reports whether an error other
// than a ctx error is acceptable right now (the session's replica stopped).
func (a *agLoad) run(s *quorumlock.Session, where string, stop <-chan struct{}, allowed func(error) bool) {
	const callBudget = 5 * time.Second
	const slack = 2 * time.Second
	for {
		select {
		case <-stop:
			return
		default:
		}
		name := a.names[rand.IntN(len(a.names))]
		ctx, cancel := context.WithTimeout(context.Background(), callBudget)
		start := time.Now()
		l, err := s.Acquire(ctx, name)
		if took := time.Since(start); took > callBudget+slack {
			a.fail("%s: Acquire(%s) returned %v after its %v ctx", where, name, took, callBudget)
		}
		if err != nil {
			cancel()
			if errors.Is(err, context.DeadlineExceeded) {
				a.timeout.Add(1)
				continue
			}
			if allowed(err) {
				return
			}
			a.fail("%s: Acquire(%s) session %d: %v", where, name, s.ID(), err)
			return
		}
		if n := a.inCS[name].Add(1); n != 1 {
			a.fail("%s: %d holders of %s at once", where, n, name)
		}
		a.mu.Lock()
		if l.Token() <= a.last[name] {
			a.errs = append(a.errs, fmt.Sprintf("%s: session %d got token %d of %s after %s had %d", where, s.ID(), l.Token(), name, a.lastBy[name], a.last[name]))
		}
		a.last[name] = l.Token()
		a.lastBy[name] = fmt.Sprintf("%s (session %d)", where, s.ID())
		a.mu.Unlock()
		if err := a.fence.Admit(name, l.Token()); err != nil {
			a.fail("%s: fence refused token %d of %s: %v", where, l.Token(), name, err)
		}
		a.grants.Add(1)
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		select {
		case <-l.Lost():
			if !allowed(quorumlock.ErrSessionExpired) {
				a.fail("%s: lock %s token %d lost while session %d runs", where, name, l.Token(), s.ID())
			}
		default:
		}
		a.inCS[name].Add(-1)
		cancel()
		// Release under a ctx of its own; one that ends before the answer
		// (ErrUnknownOutcome) is settled by releasing again, as Release's
		// doc says, or the session's next Acquire of the name would get
		// the same grant back.
		try := 1
		for ; ; try++ {
			if try > 4 {
				a.fail("%s: Release(%s) token %d session %d: no outcome in %d tries", where, name, l.Token(), s.ID(), try-1)
				return
			}
			rctx, rcancel := context.WithTimeout(context.Background(), callBudget)
			start = time.Now()
			err = l.Release(rctx)
			rcancel()
			if took := time.Since(start); took > callBudget+slack {
				a.fail("%s: Release(%s) returned after %v", where, name, took)
			}
			if !errors.Is(err, quorumlock.ErrUnknownOutcome) || !errors.Is(err, context.DeadlineExceeded) {
				break
			}
			a.releaseTimeout.Add(1)
		}
		if err != nil {
			if allowed(err) {
				return
			}
			if errors.Is(err, quorumlock.ErrNotHeld) && try > 1 {
				// An earlier attempt whose outcome was unknown freed the
				// grant: the retry finds it no longer current, which
				// settles the release (Release's doc).
				continue
			}
			a.fail("%s: Release(%s) token %d session %d: %v", where, name, l.Token(), s.ID(), err)
			return
		}
	}
}

func (a *agLoad) check(t *testing.T) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.errs {
		t.Error(e)
	}
	if a.grants.Load() == 0 {
		t.Error("no lock was granted")
	}
	t.Logf("%d grants, %d Acquire ctx timeouts, %d Release ctx timeouts", a.grants.Load(), a.timeout.Load(), a.releaseTimeout.Load())
}

// agSessions opens n sessions spread over the nodes (round robin).
func agSessions(t *testing.T, nodes []*quorumlock.Node, n int) []*quorumlock.Session {
	t.Helper()
	out := make([]*quorumlock.Session, n)
	for i := range n {
		out[i] = specSession(testCtx(t, 15*time.Second), t, nodes[i%len(nodes)])
	}
	return out
}

// TestReviewAGLoadWithCPUHog: 5 default replicas, 30 sessions spread over
// them doing Acquire/Release on 4 shared names for 10 s (a whole lease: a
// session whose heartbeats starve would end within it) while goroutines
// spin on every core. No session may end, no lock may be lost, holders exclude
// each other, tokens grow per name, every call returns within its ctx, and
// nothing is wrong so the leader must not change (no election: the term is
// the same at the end).
func TestReviewAGLoadWithCPUHog(t *testing.T) {
	nodes := agCluster(t, 5)
	specLeader(t, nodes)
	sessions := agSessions(t, nodes, 30)
	term := agMaxTerm(nodes, nil)

	hogN := agHogN()
	hog := agHog(hogN, 15*time.Second)
	defer hog()
	load := newAGLoad("a", "b", "c", "d")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, s := range sessions {
		wg.Go(func() {
			load.run(s, fmt.Sprintf("session %d on replica %d", s.ID(), nodes[i%len(nodes)].ID()), stop, func(error) bool { return false })
		})
	}
	time.Sleep(10 * time.Second)
	close(stop)
	wg.Wait()
	hog()

	load.check(t)
	for _, s := range sessions {
		if closed(s.Done()) {
			t.Errorf("session %d ended under load: %v", s.ID(), s.Err())
		}
	}
	if got := agMaxTerm(nodes, nil); got != term {
		t.Errorf("raft term went from %d to %d under load with nothing wrong", term, got)
	}
}

// TestReviewAGFailoverUnderLoad: 5 default replicas, 25 sessions (5 per
// replica) in Acquire/Release loops while goroutines spin on every core; the
// leader is closed (graceful hand-over), later the new leader is hard-closed.
// Only the sessions of the stopped replicas may end; every other session
// keeps working with no error but its ctx's (and sessions opened and closed
// meanwhile on the running replicas), mutual exclusion and growing tokens
// hold throughout, both Close calls return (bounded generously: a
// hang check, not a performance one), and once every replica is closed no
// goroutine is left behind.
func TestReviewAGFailoverUnderLoad(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	nodes := agCluster(t, 5)
	specLeader(t, nodes)
	sessions := agSessions(t, nodes, 25)

	hogN := agHogN()
	hog := agHog(hogN, 20*time.Second)
	defer hog()
	stopped := make([]atomic.Bool, len(nodes))
	load := newAGLoad("a", "b", "c")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, s := range sessions {
		r := i % len(nodes)
		wg.Go(func() {
			load.run(s, fmt.Sprintf("session %d on replica %d", s.ID(), nodes[r].ID()), stop, func(err error) bool {
				return stopped[r].Load() && (errors.Is(err, quorumlock.ErrClosed) || errors.Is(err, quorumlock.ErrSessionExpired))
			})
		})
	}
	// Meanwhile sessions come and go on every replica: NewSession and
	// Session.Close must work throughout on the running ones.
	wg.Go(func() {
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			r := k % len(nodes)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s, err := nodes[r].NewSession(ctx)
			if err == nil {
				err = s.Close(ctx)
			}
			cancel()
			if err != nil && !stopped[r].Load() {
				load.fail("NewSession/Close on running replica %d: %v", nodes[r].ID(), err)
			}
		}
	})
	skip := map[int]bool{}
	stopLeader := func(how string, close func(*quorumlock.Node) error) {
		time.Sleep(1500 * time.Millisecond)
		lead := specLeader(t, nodes, slices.Collect(maps.Keys(skip))...)
		term := agMaxTerm(nodes, skip)
		stopped[lead].Store(true)
		skip[lead] = true
		start := time.Now()
		if err := close(nodes[lead]); err != nil {
			t.Errorf("%s of leader %d: %v", how, nodes[lead].ID(), err)
		}
		took := time.Since(start)
		if took > 15*time.Second {
			t.Errorf("%s of leader %d took %v", how, nodes[lead].ID(), took)
		}
		next := specLeader(t, nodes, slices.Collect(maps.Keys(skip))...)
		t.Logf("%s of leader %d took %v; replica %d leads %v after it began, term %d -> %d", how, nodes[lead].ID(), took, nodes[next].ID(), time.Since(start), term, agMaxTerm(nodes, skip))
	}
	stopLeader("Close", (*quorumlock.Node).Close)
	stopLeader("HardClose", (*quorumlock.Node).HardClose)
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	hog()

	load.check(t)
	for i, s := range sessions {
		if r := i % len(nodes); !skip[r] && closed(s.Done()) {
			t.Errorf("session %d on running replica %d ended: %v", s.ID(), nodes[r].ID(), s.Err())
		}
	}
	for i, s := range sessions {
		err := s.Close(testCtx(t, 10*time.Second))
		if r := i % len(nodes); !skip[r] && err != nil {
			t.Errorf("Close of session %d on running replica %d: %v", s.ID(), nodes[r].ID(), err)
		}
	}
	for _, n := range nodes {
		n.Close()
	}
	if err := goleak.Find(ignore); err != nil {
		t.Errorf("goroutines left after every replica closed: %v", err)
	}
}

// TestReviewAGElectUnderLoad: 5 default replicas each campaign for one role
// with Node.Elect and observe it, while goroutines spin on every core. With
// nothing wrong the first leader keeps the role (no other candidate wins, no
// observer sees a change); then its replica is closed (the role passes on
// when the closed replica's session runs out, a TTL later), and the next
// leader resigns. Each new leader's epoch is
// above the last, the deposed leader's Done has closed before the next one
// leads, the candidates of running replicas fail only by their replica
// stopping, and every surviving observer's stream never goes back and ends
// on the last leader.
func TestReviewAGElectUnderLoad(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	nodes := agCluster(t, 5)
	specLeader(t, nodes)
	hog := agHog(agHogN(), 30*time.Second)
	defer hog()

	octx, ocancel := context.WithCancel(context.Background())
	defer ocancel()
	type event struct {
		at   time.Time
		info quorumlock.LeaderInfo
	}
	events := make([][]event, len(nodes))
	var omu sync.Mutex
	var owg sync.WaitGroup
	for i, n := range nodes {
		ch := n.Observe(octx, "sched")
		owg.Go(func() {
			for info := range ch {
				omu.Lock()
				events[i] = append(events[i], event{time.Now(), info})
				omu.Unlock()
			}
		})
	}

	type won struct {
		idx int
		ld  *quorumlock.Leadership
		err error
	}
	results := make(chan won, len(nodes))
	ectx, ecancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer ecancel()
	for i, n := range nodes {
		go func() {
			ld, err := n.Elect(ectx, "sched", []byte(strconv.Itoa(i)))
			results <- won{i, ld, err}
		}()
	}
	stopped := map[int]bool{}
	pending := len(nodes) // Elect calls that have not returned
	next := func(what string) won {
		t.Helper()
		for {
			select {
			case w := <-results:
				pending--
				if w.err != nil {
					if !stopped[w.idx] {
						t.Fatalf("%s: Elect on running replica %d: %v", what, nodes[w.idx].ID(), w.err)
					}
					continue
				}
				return w
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: no new leader within 30 s", what)
			}
		}
	}

	first := next("first")
	// Nothing is wrong: the role must not move for 3 s.
	select {
	case w := <-results:
		t.Fatalf("replica %d won the role (err %v) while replica %d led it", nodes[w.idx].ID(), w.err, nodes[first.idx].ID())
	case <-first.ld.Done():
		t.Fatalf("leadership of replica %d lost with nothing wrong: %v", nodes[first.idx].ID(), first.ld.Session().Err())
	case <-time.After(3 * time.Second):
	}

	leaders := []won{first}
	depose := []struct {
		how string
		do  func(w won)
	}{
		{"Close", func(w won) { stopped[w.idx] = true; nodes[w.idx].Close() }},
		{"Resign", func(w won) {
			if err := w.ld.Resign(testCtx(t, 10*time.Second)); err != nil {
				t.Errorf("Resign of replica %d: %v", nodes[w.idx].ID(), err)
			}
		}},
	}
	for _, d := range depose {
		cur := leaders[len(leaders)-1]
		start := time.Now()
		d.do(cur)
		w := next(d.how)
		t.Logf("%s: replica %d leads with epoch %d after %v", d.how, nodes[w.idx].ID(), w.ld.Epoch(), time.Since(start))
		if !closed(cur.ld.Done()) {
			t.Errorf("after %s, replica %d leads while the old leader's Done is open", d.how, nodes[w.idx].ID())
		}
		if w.ld.Epoch() <= cur.ld.Epoch() {
			t.Errorf("after %s, epoch %d follows %d", d.how, w.ld.Epoch(), cur.ld.Epoch())
		}
		leaders = append(leaders, w)
	}
	last := leaders[len(leaders)-1]

	// The surviving observers catch up with the last leader.
	deadline := time.Now().Add(15 * time.Second)
	for i := range nodes {
		if stopped[i] {
			continue
		}
		for {
			omu.Lock()
			ev := events[i]
			ok := len(ev) > 0 && ev[len(ev)-1].info.Session == last.ld.Session().ID()
			omu.Unlock()
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("observer on replica %d does not report the last leader: %+v", nodes[i].ID(), ev)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ocancel()
	owg.Wait()
	hog()
	for i, ev := range events {
		var epoch quorumlock.Token
		seen := map[uint64]bool{}
		var prev uint64
		for _, e := range ev {
			if e.info.Epoch < epoch {
				t.Errorf("observer on replica %d: epoch %d after %d", nodes[i].ID(), e.info.Epoch, epoch)
			}
			epoch = e.info.Epoch
			if s := e.info.Session; s != prev {
				if s != 0 && seen[s] {
					t.Errorf("observer on replica %d: leader session %d came back", nodes[i].ID(), s)
				}
				if s != 0 && prev != 0 {
					t.Errorf("observer on replica %d: leader %d followed %d with no event without a leader between", nodes[i].ID(), s, prev)
				}
				seen[s] = true
				prev = s
			}
		}
	}
	last.ld.Resign(testCtx(t, 10*time.Second))

	// Closing every replica with candidates still waiting on some of them
	// ends their Elect calls and leaves no goroutine behind.
	for i, n := range nodes {
		start := time.Now()
		n.Close()
		if took := time.Since(start); took > 15*time.Second {
			t.Errorf("Close of replica %d took %v", nodes[i].ID(), took)
		}
	}
	for range pending {
		select {
		case w := <-results:
			// A candidate may have won after the last Resign; its
			// leadership ended with its replica.
			if w.err == nil && !closed(w.ld.Done()) {
				t.Errorf("replica %d leads the role after Close", nodes[w.idx].ID())
			}
		case <-time.After(10 * time.Second):
			t.Fatal("an Elect call did not return after its replica closed")
		}
	}
	if err := goleak.Find(ignore); err != nil {
		t.Errorf("goroutines left after every replica closed: %v", err)
	}
}

// TestReviewAGClientFailoverUnderLoad: a remote Client dialled with its
// defaults runs 20 sessions in Acquire/Release loops against 5 default
// replicas while goroutines spin on every core; the leader is closed, then
// the new leader is hard-closed. No client session may end (the cluster
// keeps a quorum throughout), every call fails only by its ctx, mutual
// exclusion and growing tokens hold, and after the sessions, the client and
// the replicas close no goroutine is left.
func TestReviewAGClientFailoverUnderLoad(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	nodes := agCluster(t, 5)
	specLeader(t, nodes)
	cl, err := quorumlock.Dial(testCtx(t, 10*time.Second), specAddrs(nodes))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	hog := agHog(agHogN(), 30*time.Second)
	defer hog()
	load := newAGLoad("a", "b", "c")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	sessions := make([]*quorumlock.Session, 20)
	for k := range sessions {
		s := specSession(testCtx(t, 10*time.Second), t, cl)
		sessions[k] = s
		wg.Go(func() {
			load.run(s, fmt.Sprintf("client session %d", s.ID()), stop, func(error) bool { return false })
		})
	}
	skip := map[int]bool{}
	for _, stopLeader := range []func(*quorumlock.Node) error{(*quorumlock.Node).Close, (*quorumlock.Node).HardClose} {
		time.Sleep(1500 * time.Millisecond)
		lead := specLeader(t, nodes, slices.Collect(maps.Keys(skip))...)
		skip[lead] = true
		stopLeader(nodes[lead])
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	hog()

	load.check(t)
	for _, s := range sessions {
		if closed(s.Done()) {
			t.Errorf("client session %d ended: %v", s.ID(), s.Err())
		}
		if err := s.Close(testCtx(t, 10*time.Second)); err != nil {
			t.Errorf("Close of client session %d: %v", s.ID(), err)
		}
	}
	if err := cl.Close(); err != nil {
		t.Errorf("Client.Close: %v", err)
	}
	for _, n := range nodes {
		n.Close()
	}
	if err := goleak.Find(ignore); err != nil {
		t.Errorf("goroutines left after the client and every replica closed: %v", err)
	}
}
