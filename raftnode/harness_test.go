package raftnode

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/clock"
)

// The harness runs N Nodes in one process: a memStore each, a transport
// that routes messages between them (with cuts and a test hook), a
// recording state machine, and one clock.Manual that the test advances to
// tick raft. Every message sent is checked against the sender's store at
// the moment Send is called (DESIGN.md invariant 10).

const (
	testTick      = 100 * time.Millisecond // one raft tick, on the manual clock
	electionTicks = 10
	waitTimeout   = 10 * time.Second // wall-clock bound on every wait
)

// memStore is a LogStore over raft.MemoryStorage: Save is SetHardState plus
// Append. It records every Save, can be made to fail for good, and can hold
// the next Save that carries entries (a slow fsync) until the test opens it.
type memStore struct {
	*raft.MemoryStorage

	mu       sync.Mutex
	hs       *raftpb.HardState // last HardState saved
	saves    []saveCall
	failWith error
	failOne  bool // failWith is returned once, then cleared (failOnce)
	failed   bool // a Save has returned failWith
	failedAt int  // how many Saves had been made when one failed
	gate     *gate
	readErr  error // returned by Entries, Term and Snapshot when set (failReads)
	readFail bool  // a read has returned readErr
	// compactErrs records each Compact past the saved snapshot.
	compactErrs []string
}

type saveCall struct {
	entries   int // every entry, raft's empty ones included
	data      int // entries with a payload
	hardState bool
}

// gate holds one Save: entered is closed when Save reaches it, and Save
// waits until open is called.
type gate struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

func newMemStore() *memStore { return &memStore{MemoryStorage: raft.NewMemoryStorage()} }

func (s *memStore) Save(st *raftpb.HardState, ents []*raftpb.Entry) error {
	s.mu.Lock()
	g := s.gate
	if g != nil && len(ents) > 0 {
		s.gate = nil
	} else {
		g = nil
	}
	s.mu.Unlock()
	if g != nil {
		close(g.entered)
		<-g.release
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	call := saveCall{entries: len(ents), hardState: !raft.IsEmptyHardState(st)}
	for _, e := range ents {
		if len(e.GetData()) > 0 {
			call.data++
		}
	}
	s.saves = append(s.saves, call)
	if s.failWith != nil {
		err := s.failWith
		if s.failOne {
			s.failWith = nil
		}
		s.failed = true
		s.failedAt = len(s.saves)
		return err
	}
	if !raft.IsEmptyHardState(st) {
		s.hs = proto.Clone(st).(*raftpb.HardState)
		if err := s.MemoryStorage.SetHardState(proto.Clone(st).(*raftpb.HardState)); err != nil {
			return err
		}
	}
	return s.MemoryStorage.Append(ents)
}

// failNow makes every later Save return err.
func (s *memStore) failNow(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failWith = err
}

// failOnce makes the next Save return err and later ones succeed, as a
// store would whose fsync failed once and then "worked": the node must
// not find out, because it must never Save again after a failure.
func (s *memStore) failOnce(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failWith, s.failOne = err, true
}

// savesAfterFailure returns how many Saves were made after the one that
// failed.
func (s *memStore) savesAfterFailure() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.saves) - s.failedAt
}

// failReads makes every later Entries, Term and Snapshot return err, as a
// disk that fails reads (EIO, a damaged block) does.
func (s *memStore) failReads(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readErr = err
}

func (s *memStore) readFault() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readErr != nil {
		s.readFail = true
	}
	return s.readErr
}

// hasFailedRead reports whether a read has returned the injected error.
func (s *memStore) hasFailedRead() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readFail
}

func (s *memStore) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	if err := s.readFault(); err != nil {
		return nil, err
	}
	return s.MemoryStorage.Entries(lo, hi, maxSize)
}

func (s *memStore) Term(i uint64) (uint64, error) {
	if err := s.readFault(); err != nil {
		return 0, err
	}
	return s.MemoryStorage.Term(i)
}

func (s *memStore) Snapshot() (*raftpb.Snapshot, error) {
	if err := s.readFault(); err != nil {
		return nil, err
	}
	return s.MemoryStorage.Snapshot()
}

func (s *memStore) hasFailed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// holdNextSave makes the next Save that carries entries wait for the
// returned gate to open.
func (s *memStore) holdNextSave() *gate {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = &gate{entered: make(chan struct{}), release: make(chan struct{})}
	return s.gate
}

func (s *memStore) openGate() {
	s.mu.Lock()
	g := s.gate
	s.gate = nil
	s.mu.Unlock()
	if g != nil {
		g.open()
	}
}

func (s *memStore) hardState() *raftpb.HardState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hs
}

func (s *memStore) saveCalls() []saveCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.saves)
}

func (s *memStore) lastIndex() uint64 {
	last, _ := s.MemoryStorage.LastIndex()
	return last
}

// indexOf returns the index of the entry with payload d in the store's
// log, or 0.
func (s *memStore) indexOf(d string) uint64 {
	first, _ := s.MemoryStorage.FirstIndex()
	ents, err := s.MemoryStorage.Entries(first, s.lastIndex()+1, math.MaxUint64)
	if err != nil {
		return 0
	}
	for _, e := range ents {
		if string(e.GetData()) == d {
			return e.GetIndex()
		}
	}
	return 0
}

// smEvent is one call into the state machine.
type smEvent struct {
	kind string // "apply", "ready" or "lost"
	term uint64 // ready: the term; apply: the highest term among the entries
	last uint64 // apply: the index of the last entry
}

// recSM is a StateMachine that records every call.
type recSM struct {
	mu      sync.Mutex
	events  []smEvent
	applied []*raftpb.Entry
	errs    []string // entries applied out of order
}

func (s *recSM) Apply(ents []*raftpb.Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ev := smEvent{kind: "apply"}
	for _, e := range ents {
		want := uint64(1)
		if n := len(s.applied); n > 0 {
			want = s.applied[n-1].GetIndex() + 1
		}
		if e.GetIndex() != want {
			s.errs = append(s.errs, fmt.Sprintf("applied index %d, want %d", e.GetIndex(), want))
		}
		s.applied = append(s.applied, proto.Clone(e).(*raftpb.Entry))
		ev.term = max(ev.term, e.GetTerm())
		ev.last = e.GetIndex()
	}
	s.events = append(s.events, ev)
}

func (s *recSM) LeaderReady(term uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, smEvent{kind: "ready", term: term})
}

func (s *recSM) LeaderLost() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, smEvent{kind: "lost"})
}

func (s *recSM) eventLog() []smEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

// data returns the payloads of the applied normal entries, in log order.
func (s *recSM) data() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, e := range s.applied {
		if e.GetType() == raftpb.EntryNormal && len(e.GetData()) > 0 {
			out = append(out, string(e.GetData()))
		}
	}
	return out
}

// indexOf returns the index at which payload d was applied, or 0.
func (s *recSM) indexOf(d string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.applied {
		if string(e.GetData()) == d {
			return e.GetIndex()
		}
	}
	return 0
}

// readyFor reports whether LeaderReady(term) was called.
func (s *recSM) readyFor(term uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range s.events {
		if ev.kind == "ready" && ev.term == term {
			return true
		}
	}
	return false
}

// lastLeadershipEvent returns the kind of the latest ready or lost event.
func (s *recSM) lastLeadershipEvent() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.events) - 1; i >= 0; i-- {
		if k := s.events[i].kind; k != "apply" {
			return k
		}
	}
	return ""
}

// stepClock is the cluster's clock.Manual; it remembers the tickers it
// hands out so that the test can wait, after each Advance, until every
// running node has taken its tick. Without that, a node starved of CPU
// (-race, a loaded machine) falls many ticks behind and elections churn.
type stepClock struct {
	*clock.Manual
	mu      sync.Mutex
	tickers []*stepTicker
}

type stepTicker struct {
	clock.Ticker
	stopped atomic.Bool
}

func (t *stepTicker) Stop() {
	t.stopped.Store(true)
	t.Ticker.Stop()
}

func (c *stepClock) NewTicker(d time.Duration) clock.Ticker {
	t := &stepTicker{Ticker: c.Manual.NewTicker(d)}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tickers = append(c.tickers, t)
	return t
}

// tick advances one tick and waits (a bounded while: a node may be held in
// a Save on purpose) until every running node has taken it.
func (c *stepClock) tick() {
	c.Advance(testTick)
	c.mu.Lock()
	tickers := slices.Clone(c.tickers)
	c.mu.Unlock()
	deadline := time.Now().Add(100 * time.Millisecond)
	for _, t := range tickers {
		for !t.stopped.Load() && len(t.C()) > 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// fatalLog records OnFatal calls.
type fatalLog struct {
	mu   sync.Mutex
	errs []error
}

func (f *fatalLog) record(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, err)
}

func (f *fatalLog) calls() []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.errs)
}

// hookFunc sees every message the network would deliver, on the sender's
// goroutine; it returns false to drop the message.
type hookFunc func(from uint64, m *raftpb.Message) bool

type cluster struct {
	t      *testing.T
	clk    *stepClock
	ids    []uint64
	nodes  map[uint64]*Node
	stores map[uint64]*memStore
	sms    map[uint64]*recSM
	fatals map[uint64]*fatalLog

	mu         sync.Mutex
	cut        map[[2]uint64]bool
	hook       hookFunc
	violations []string
	counts     map[string]int
	onSave     map[uint64][]int // entries of each OnSave call, per member
}

// peerTransport is the Transport of one member.
type peerTransport struct {
	c    *cluster
	from uint64
}

func (p peerTransport) Send(msgs []*raftpb.Message) {
	for _, m := range msgs {
		p.c.route(p.from, m)
	}
}

func newCluster(t *testing.T, size int) *cluster {
	t.Helper()
	return newClusterWith(t, size, nil)
}

// newClusterWith is newCluster with each member's Config passed through
// mutate (when not nil) before the member is created.
func newClusterWith(t *testing.T, size int, mutate func(*Config)) *cluster {
	t.Helper()
	c := &cluster{
		t:      t,
		clk:    &stepClock{Manual: clock.NewManual(time.Unix(1_000_000, 0))},
		nodes:  make(map[uint64]*Node),
		stores: make(map[uint64]*memStore),
		sms:    make(map[uint64]*recSM),
		fatals: make(map[uint64]*fatalLog),
		cut:    make(map[[2]uint64]bool),
		counts: make(map[string]int),
		onSave: make(map[uint64][]int),
	}
	for i := 1; i <= size; i++ {
		c.ids = append(c.ids, uint64(i))
	}
	for _, id := range c.ids {
		c.stores[id] = newMemStore()
		c.sms[id] = &recSM{}
		c.fatals[id] = &fatalLog{}
		cfg := Config{
			ID:             id,
			Peers:          c.ids,
			Storage:        c.stores[id],
			Transport:      peerTransport{c, id},
			StateMachine:   c.sms[id],
			Clock:          c.clk,
			TickInterval:   testTick,
			ElectionTicks:  electionTicks,
			HeartbeatTicks: 1,
			OnFatal:        c.fatals[id].record,
			OnSave: func(_ time.Duration, entries int) {
				c.mu.Lock()
				c.onSave[id] = append(c.onSave[id], entries)
				c.mu.Unlock()
			},
		}
		if mutate != nil {
			mutate(&cfg)
		}
		n, err := New(cfg)
		if err != nil {
			t.Fatalf("New(%d): %v", id, err)
		}
		c.nodes[id] = n
	}
	t.Cleanup(c.close)
	for _, id := range c.ids {
		c.nodes[id].Start()
	}
	return c
}

func (c *cluster) close() {
	for _, id := range c.ids {
		c.stores[id].openGate()
	}
	for _, id := range c.ids {
		c.nodes[id].Stop()
	}
	for _, v := range c.takeViolations() {
		c.t.Errorf("invariant 10: %s", v)
	}
	for _, id := range c.ids {
		for _, v := range c.stores[id].takeCompactErrs() {
			c.t.Errorf("invariant 10: node %d %s", id, v)
		}
	}
	for _, id := range c.ids {
		sm := c.sms[id]
		sm.mu.Lock()
		for _, e := range sm.errs {
			c.t.Errorf("node %d: %s", id, e)
		}
		sm.mu.Unlock()
	}
}

func (c *cluster) route(from uint64, m *raftpb.Message) {
	c.checkSend(from, m)
	c.mu.Lock()
	cut, hook := c.cut[[2]uint64{from, m.GetTo()}], c.hook
	c.mu.Unlock()
	if cut || (hook != nil && !hook(from, m)) {
		return
	}
	c.deliver(m)
}

// deliver hands a copy of m to its recipient.
func (c *cluster) deliver(m *raftpb.Message) {
	if n := c.nodes[m.GetTo()]; n != nil {
		n.Step(proto.Clone(m).(*raftpb.Message))
	}
}

// checkSend runs on the sender's goroutine at the moment Send is called,
// so the stores show exactly what was durable when the message left: every
// append a node acknowledges and every vote it grants must already be saved
// in its own store, a node whose Save failed sends nothing more, and the
// commit index a leader announces must be durable in a quorum of stores. A
// node whose log read failed sends nothing more either (raft gave up on its
// state: see readGuard). A
// leader's append may carry entries it has not saved yet: it writes them in
// parallel with its followers (raft thesis §10.2.1) and counts its own copy
// only once saved, which the quorum check verifies.
func (c *cluster) checkSend(from uint64, m *raftpb.Message) {
	st := c.stores[from]
	var bad, counted string
	switch typ := m.GetType(); {
	case st.hasFailed():
		bad = fmt.Sprintf("%d sent %v to %d after its Save failed", from, typ, m.GetTo())
	case st.hasFailedRead():
		bad = fmt.Sprintf("%d sent %v to %d after a log read failed", from, typ, m.GetTo())
	case typ == raftpb.MsgApp || typ == raftpb.MsgHeartbeat:
		if typ == raftpb.MsgApp && len(m.GetEntries()) > 0 {
			counted = "entries sent"
			for _, e := range m.GetEntries() {
				if term, err := st.MemoryStorage.Term(e.GetIndex()); err != nil || term != e.GetTerm() {
					c.mu.Lock()
					c.counts["entries sent before the leader saved them"]++
					c.mu.Unlock()
					break
				}
			}
		}
		if commit := m.GetCommit(); commit > 0 && !c.durableOnQuorum(commit) {
			bad = fmt.Sprintf("%d announced commit index %d to %d before a quorum saved it", from, commit, m.GetTo())
		}
	case typ == raftpb.MsgVoteResp && !m.GetReject():
		counted = "votes granted"
		if hs := st.hardState(); hs.GetTerm() != m.GetTerm() || hs.GetVote() != m.GetTo() {
			bad = fmt.Sprintf("%d granted its vote to %d in term %d before saving it (saved: term %d vote %d)",
				from, m.GetTo(), m.GetTerm(), hs.GetTerm(), hs.GetVote())
		}
	case typ == raftpb.MsgAppResp && !m.GetReject():
		counted = "appends acknowledged"
		if last := st.lastIndex(); m.GetIndex() > last {
			bad = fmt.Sprintf("%d acknowledged index %d to %d before saving it (last index %d)",
				from, m.GetIndex(), m.GetTo(), last)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if counted != "" {
		c.counts[counted]++
	}
	if bad != "" {
		c.violations = append(c.violations, bad)
	}
}

// durableOnQuorum reports whether a quorum of the stores hold an entry at
// index with one same term (or have compacted it into a snapshot).
func (c *cluster) durableOnQuorum(index uint64) bool {
	terms := make(map[uint64]int)
	for _, id := range c.ids {
		term, err := c.stores[id].MemoryStorage.Term(index) // what is durable, past injected read faults
		switch {
		case errors.Is(err, raft.ErrCompacted):
			terms[0]++ // covered by a snapshot: committed long ago
		case err == nil:
			terms[term]++
		}
	}
	for term, n := range terms {
		if n > len(c.ids)/2 || (term != 0 && n+terms[0] > len(c.ids)/2) {
			return true
		}
	}
	return false
}

func (c *cluster) takeViolations() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.violations
	c.violations = nil
	return v
}

func (c *cluster) count(what string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[what]
}

func (c *cluster) setHook(h hookFunc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hook = h
}

// isolate cuts every link to and from id.
func (c *cluster) isolate(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range c.ids {
		if o != id {
			c.cut[[2]uint64{id, o}] = true
			c.cut[[2]uint64{o, id}] = true
		}
	}
}

func (c *cluster) heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.cut)
}

// others returns every member but id.
func (c *cluster) others(id uint64) []uint64 {
	var out []uint64
	for _, o := range c.ids {
		if o != id {
			out = append(out, o)
		}
	}
	return out
}

// tickUntil advances the clock one tick at a time until cond holds.
func (c *cluster) tickUntil(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s", what)
		}
		c.clk.tick()
		time.Sleep(200 * time.Microsecond) // let the nodes handle what the tick sent
	}
}

// waitFor polls cond without ticking.
func (c *cluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// tickInBackground advances the clock a tick per millisecond until the
// returned function is called (also at cleanup).
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
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	c.t.Cleanup(stop)
	return stop
}

// leaderAmong returns the member of ids that they all follow, once it has
// applied an entry of its term (LeaderReady), or 0.
func (c *cluster) leaderAmong(ids []uint64) uint64 {
	var lead uint64
	for _, id := range ids {
		if c.nodes[id].Status().State == raft.StateLeader {
			lead = id
		}
	}
	if lead == 0 {
		return 0
	}
	term := c.nodes[lead].Status().Term
	for _, id := range ids {
		if st := c.nodes[id].Status(); st.Leader != lead || st.Term != term {
			return 0
		}
	}
	if !c.sms[lead].readyFor(term) {
		return 0
	}
	return lead
}

// waitLeader ticks until members (default: all) agree on a ready leader.
func (c *cluster) waitLeader(members ...uint64) uint64 {
	c.t.Helper()
	if len(members) == 0 {
		members = c.ids
	}
	var lead uint64
	c.tickUntil(fmt.Sprintf("a leader among %v", members), func() bool {
		lead = c.leaderAmong(members)
		return lead != 0
	})
	return lead
}

// settledLeader waits for a leader and for an entry it proposed ("x") to be
// applied everywhere, and returns the leader.
func (c *cluster) settledLeader() uint64 {
	c.t.Helper()
	lead := c.waitLeader()
	c.propose(lead, "x")
	c.waitApplied("x", c.ids...)
	return lead
}

// transfer ticks until to is the ready leader of every member, asking
// the current leader to hand over (again, should a transfer time out).
func (c *cluster) transfer(to uint64) {
	c.t.Helper()
	c.tickUntil(fmt.Sprintf("leadership transferred to %d", to), func() bool {
		for _, id := range c.ids {
			if id != to && c.nodes[id].Status().State == raft.StateLeader {
				c.nodes[id].TransferLeadership(to)
			}
		}
		return c.leaderAmong(c.ids) == to
	})
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

func (c *cluster) propose(id uint64, data string) {
	c.t.Helper()
	if err := c.nodes[id].Propose(testCtx(c.t), []byte(data)); err != nil {
		c.t.Fatalf("Propose(%q) on %d: %v", data, id, err)
	}
}

// waitApplied ticks until every member of ids has applied payload d.
func (c *cluster) waitApplied(d string, ids ...uint64) {
	c.t.Helper()
	c.tickUntil(fmt.Sprintf("%q applied on %v", d, ids), func() bool {
		for _, id := range ids {
			if c.sms[id].indexOf(d) == 0 {
				return false
			}
		}
		return true
	})
}

// checkLeadership verifies the LeaderReady/LeaderLost contract on the
// recorded calls of every member: ready and lost alternate; each ready is
// for a newer term and comes right after an Apply that included an entry
// of that term (so every earlier entry was applied first); no two members
// are ready for the same term. It returns each member's ready terms.
func (c *cluster) checkLeadership() map[uint64][]uint64 {
	c.t.Helper()
	out := make(map[uint64][]uint64)
	readyBy := make(map[uint64]uint64) // term -> member
	for _, id := range c.ids {
		leading := false
		var lastTerm, appliedTerm uint64
		prev := ""
		for i, ev := range c.sms[id].eventLog() {
			switch ev.kind {
			case "apply":
				appliedTerm = max(appliedTerm, ev.term)
			case "ready":
				if leading {
					c.t.Errorf("node %d: event %d: LeaderReady(%d) while already leader", id, i, ev.term)
				}
				if ev.term <= lastTerm {
					c.t.Errorf("node %d: event %d: LeaderReady(%d) after LeaderReady(%d)", id, i, ev.term, lastTerm)
				}
				if prev != "apply" || appliedTerm != ev.term {
					c.t.Errorf("node %d: event %d: LeaderReady(%d) not right after applying an entry of its term (previous event %q, highest applied term %d)",
						id, i, ev.term, prev, appliedTerm)
				}
				if o, ok := readyBy[ev.term]; ok {
					c.t.Errorf("nodes %d and %d both LeaderReady for term %d", o, id, ev.term)
				}
				readyBy[ev.term] = id
				leading, lastTerm = true, ev.term
				out[id] = append(out[id], ev.term)
			case "lost":
				if !leading {
					c.t.Errorf("node %d: event %d: LeaderLost while not leader", id, i)
				}
				leading = false
			}
			prev = ev.kind
		}
	}
	return out
}
