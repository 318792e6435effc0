// Package service is the server side of quorumlock's client API on one
// replica. It owns the replica's lock table (internal/fsm), applies committed
// entries to it, and, while the replica is the ready leader, turns client
// requests into log entries, answers them when they apply, keeps the session
// timers and proposes expiries.
//
// Goroutines: Apply, LeaderReady and LeaderLost are called by the raft node's
// goroutine; the request methods (Propose, Holder, Heartbeat, Status) by any
// number of caller goroutines (gRPC handlers or in-process callers); one
// goroutine of its own scans session timers (Run). A single mutex guards the
// lock table, the timers and the waiters; no call into the raft node is made
// while holding it.
package service

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/raftnode"
)

// Raft is what the service needs from the replica's raft node.
type Raft interface {
	Propose(ctx context.Context, data []byte) error
	// ProposeAsync queues an entry without waiting for raft to take it;
	// a refusal is reported through p.Refused, an entry never taken
	// because the node stopped through Done (raftnode.Node.ProposeAsync).
	// With p.Deferred the entry may be held until the next proposal,
	// ReleaseDeferred or tick, keeping arrival order; it is not held if
	// ReleaseDeferred was called since DeferEpoch returned p.Epoch
	// (raftnode.Node.ProposeDeferred).
	ProposeAsync(ctx context.Context, p raftnode.AsyncProposal) error
	// Done is closed when the node has stopped.
	Done() <-chan struct{}
	// DeferEpoch counts ReleaseDeferred calls (raftnode.Node.DeferEpoch).
	DeferEpoch() uint64
	// ReleaseDeferred proposes the held entries soon; it never blocks and is
	// called from Apply.
	ReleaseDeferred()
	ReadIndex(ctx context.Context) (uint64, error)
	WaitApplied(ctx context.Context, index uint64) error
	Status() raftnode.Status
	// LeaderChanged returns a channel closed at the next change of the
	// leader or term in Status.
	LeaderChanged() <-chan struct{}
}

// Config configures a Service.
type Config struct {
	// Limits bound the lock table (zero fields: fsm defaults).
	Limits fsm.Limits
	// Clock times sessions. The default is clock.Real().
	Clock clock.Clock
	// ScanInterval is how often the leader looks for expired sessions. The
	// default is 100 ms.
	ScanInterval time.Duration
	// Logger: nil means no-op.
	Logger *zap.Logger
	// Peers maps member IDs to addresses, for leader hints to clients.
	Peers map[uint64]string
	// Hooks for metrics (nil: none); they must not block.
	Hooks Hooks
	// ReadyWait bounds how long a request waits at a leader that has not
	// yet applied an entry of its term before it is answered UNAVAILABLE
	// (wall clock). The default is 1 s; a replica sets its election
	// timeout.
	ReadyWait time.Duration
	// LeaderWait bounds how long a request waits at a running replica that
	// knows no leader (an election, or a leadership transfer, between the
	// vote and the new leader's first message) for one to become known,
	// before it is answered NOT_LEADER without a hint (wall clock). A
	// caller then learns the new leader at once instead of trying the
	// other replicas, which may still name the old one. The default is a
	// tenth of ReadyWait; a cut-off replica keeps a caller at most that
	// long.
	LeaderWait time.Duration
}

// Hooks report what the service did, for metrics. Each may be nil.
type Hooks struct {
	// Request: one Propose call answered (resp) or ended by its context
	// (err), after d.
	Request func(op lockpb.Op, resp *lockpb.Response, err error, d time.Duration)
	// Heartbeats: a heartbeat batch answered as the ready leader: alive
	// sessions acknowledged, gone ones reported ended.
	Heartbeats func(alive, gone int)
	// Expired: an Expire entry for n sessions was proposed.
	Expired func(n int)
}

// Service is one replica's lock table and client API handler.
type Service struct {
	lockpb.UnimplementedLockServer

	cfg  Config
	clk  clock.Clock
	log  *zap.Logger
	raft Raft
	rnd  *rand.Rand // nonces; guarded by mu

	lim fsm.Limits // the table's effective limits (fixed)

	mu       sync.Mutex
	m        *fsm.Machine
	verified *fsm.Machine  // decoded by VerifySnapshot, for the next Restore
	ready    bool          // leader of term, with every earlier entry applied
	term     uint64        // term of the current leadership when ready
	readyC   chan struct{} // closed and replaced whenever ready changes
	last     map[uint64]time.Time
	expiring map[uint64]bool
	timers   *timerQueue
	requests map[reqKey][]chan outcome
	grants   map[uint64]map[string][]chan outcome
	// A blocking acquire's grant waiter takes grants only once its own
	// request has applied queued (armed): a grant to its session before
	// that belongs to an earlier request, and may be released already.
	grantOf  map[chan outcome]chan outcome // request waiter -> its grant waiter, until the request applies
	armed    map[chan outcome]bool
	deferred map[reqKey]deferredAcquire // acquires proposed with ProposeDeferred, not yet applied
	watchers map[string][]*watcher
	stopc    chan struct{}
	stopOnce sync.Once
	runDone  chan struct{}

	// abandonedOpens holds the nonces of OpOpenSession entries this
	// leadership proposed whose proposer stopped waiting before they
	// applied (its ctx ended: a client's attempt timed out, and it sends
	// a new open). Nobody can learn such a session's ID, so it is expired
	// when it applies instead of holding a place under MaxSessions for
	// its TTL. Unless a retry of the open (same OpenID) claims it: the
	// retry's apply restarts its timer, and an attempt that finds the
	// session an earlier one opened never expires it (see Apply).
	abandonedOpens map[uint64]struct{}
	// openInFlight maps the OpenID of each open this leadership proposed
	// and has not applied to its request key: a retry of the open (its
	// client's attempt timed out, under load) waits for that entry
	// instead of logging another, which would only return the same
	// session (fsm.Command.OpenID). Without it each retry under overload
	// added an entry to the backlog that made the attempts time out. Only
	// a retry with the entry's TTL waits for it: one with another TTL (not
	// the same NewSession call: an open ID a client forged or two drew) is
	// logged, and the table answers it CodeInvalid if the entry opened the
	// session, as Service.reopen and fsm.Command.OpenID do.
	openInFlight map[uint64]inFlightOpen
	// waitCopies counts the copies of each blocking acquire (session,
	// seq) in Propose, until they return (see MaxCopiesInFlight).
	waitCopies map[reqKey]int
}

// deferredAcquire is a waiting acquire that was proposed with
// ProposeDeferred: raft may hold it until its lock's holder changes.
type deferredAcquire struct {
	session uint64
	name    string
}

type reqKey struct {
	session uint64 // 0 for OpOpenSession
	seq     uint64 // nonce for OpOpenSession
}

// outcome is what a waiter receives: a result, or notLeader when the
// leadership that would have answered ended.
type outcome struct {
	res       fsm.Result
	notLeader bool
	// reopened: an open whose OpenID named a live session, which res
	// names; expiring: that session's expiry is proposed, so the open is
	// answered "retry" (UNAVAILABLE) instead (see Apply).
	reopened, expiring bool
}

// inFlightOpen is an open's entry in flight (see Service.openInFlight):
// its request key and TTL.
type inFlightOpen struct {
	key reqKey
	ttl int64
}

// New creates a service with an empty lock table. Bind must be called before
// requests arrive.
func New(cfg Config) *Service {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.ScanInterval <= 0 {
		cfg.ScanInterval = 100 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.ReadyWait <= 0 {
		cfg.ReadyWait = time.Second
	}
	if cfg.LeaderWait <= 0 {
		cfg.LeaderWait = cfg.ReadyWait / 10
	}
	m := fsm.New(cfg.Limits)
	return &Service{
		lim:      m.Limits(),
		cfg:      cfg,
		clk:      cfg.Clock,
		log:      cfg.Logger,
		rnd:      rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		m:        m,
		last:     make(map[uint64]time.Time),
		expiring: make(map[uint64]bool),
		timers:   newTimerQueue(),
		requests: make(map[reqKey][]chan outcome),
		deferred: make(map[reqKey]deferredAcquire),
		grants:   make(map[uint64]map[string][]chan outcome),
		grantOf:  make(map[chan outcome]chan outcome),
		armed:    make(map[chan outcome]bool),
		watchers: make(map[string][]*watcher),
		stopc:    make(chan struct{}),
		runDone:  make(chan struct{}),
		readyC:   make(chan struct{}),

		abandonedOpens: make(map[uint64]struct{}),
		openInFlight:   make(map[uint64]inFlightOpen),
		waitCopies:     make(map[reqKey]int),
	}
}

// Bind attaches the raft node; call it once, before Run.
func (s *Service) Bind(r Raft) { s.raft = r }

// Limits returns the effective limits of the lock table.
func (s *Service) Limits() fsm.Limits { return s.lim }

// Run scans session timers until Stop. Call it in its own goroutine.
func (s *Service) Run() {
	defer close(s.runDone)
	t := s.clk.NewTicker(s.cfg.ScanInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C():
			s.expireDue()
		case <-s.stopc:
			return
		}
	}
}

// Stop ends Run and fails every waiting request as if leadership was lost.
func (s *Service) Stop() {
	s.stopOnce.Do(func() { close(s.stopc) })
	<-s.runDone
	s.LeaderLost()
}

// Apply implements raftnode.StateMachine.
func (s *Service) Apply(ents []*raftpb.Entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range ents {
		if e.GetType() != raftpb.EntryNormal || len(e.GetData()) == 0 {
			s.m.SetApplied(e.GetIndex())
			continue
		}
		cmd, res, evs := s.m.ApplyEntry(e.GetIndex(), e.GetTerm(), e.GetData())
		switch cmd.Op {
		case fsm.OpRevoke:
			s.deliver(reqKey{0, cmd.Nonce}, res)
		case fsm.OpOpenSession:
			_, abandoned := s.abandonedOpens[cmd.Nonce]
			delete(s.abandonedOpens, cmd.Nonce)
			if f, ok := s.openInFlight[cmd.OpenID]; ok && f.key.seq == cmd.Nonce {
				delete(s.openInFlight, cmd.OpenID)
			}
			o := outcome{res: res, reopened: res.Code == fsm.CodeOK && res.Session != e.GetIndex()}
			switch {
			case res.Code != fsm.CodeOK || !s.ready:
			case o.reopened && s.expiring[res.Session]:
				// A retry of an open whose session this leadership is
				// expiring (an earlier attempt was abandoned, or nobody
				// heartbeated it for its TTL): the Expire may apply after
				// the client got the session. It retries, and opens anew
				// once the Expire applied (or, if raft refused it, gets
				// this session).
				o.expiring = true
			case o.reopened:
				// A retry of an open whose answer was lost or late: the
				// client's lease counts from before this attempt (DESIGN.md
				// invariant 5), so the session's timer restarts now, as for
				// a new session. This also cancels an expireSoon of an
				// earlier, abandoned attempt: the session is not unused
				// (invariant 3). It is never expired as abandoned itself:
				// another attempt of the open may have received it.
				s.touch(res.Session, time.Duration(cmd.TTL), s.clk.Now())
			case abandoned:
				s.expireSoon(res.Session)
			default:
				s.touch(res.Session, time.Duration(cmd.TTL), s.clk.Now())
			}
			s.deliverOutcome(reqKey{0, cmd.Nonce}, o)
		case fsm.OpExpire:
			// An Expire ignored for its stale term was decided in a
			// leadership that ended (LeaderLost dropped its marks): the
			// marks now are this leadership's, for its own Expire still
			// behind in the log.
			if res.Code == fsm.CodeOK {
				for _, id := range cmd.IDs {
					delete(s.expiring, id)
				}
			}
		default:
			s.deliver(reqKey{cmd.Session, cmd.Seq}, res)
		}
		for _, ev := range evs {
			switch ev.Kind {
			case fsm.EventGranted:
				s.deliverGrant(ev.Session, ev.Name, outcome{res: fsm.Result{Code: fsm.CodeOK, Token: ev.Token}}, false)
			case fsm.EventSessionEnded:
				delete(s.last, ev.Session)
				delete(s.expiring, ev.Session)
				for name := range s.grants[ev.Session] {
					s.deliverGrant(ev.Session, name, outcome{res: fsm.Result{Code: fsm.CodeNoSession}}, true)
				}
			}
		}
		// After every entry, not once per batch: a grant and its release
		// applied together are two changes a watcher must see (Watch).
		if len(s.watchers) > 0 {
			s.notifyApplied(&cmd)
		}
	}
	if s.deferredDue() {
		s.raft.ReleaseDeferred()
		// Every tracked acquire is now either released or, not having
		// reached raft yet, carries a stale epoch and will not be held:
		// none needs another release.
		clear(s.deferred)
	}
}

// deferredDue reports whether a held acquire (see propose) no longer waits
// for another session: its lock is free or its own.
func (s *Service) deferredDue() bool {
	for _, d := range s.deferred {
		if h := s.m.HolderID(d.name); h == 0 || h == d.session {
			return true
		}
	}
	return false
}

func (s *Service) deliver(k reqKey, res fsm.Result) {
	s.deliverOutcome(k, outcome{res: res})
}

func (s *Service) deliverOutcome(k reqKey, o outcome) {
	for _, c := range s.requests[k] {
		if g, ok := s.grantOf[c]; ok {
			delete(s.grantOf, c)
			if o.res.Code == fsm.CodeQueued {
				s.armed[g] = true
			}
		}
		c <- o
	}
	delete(s.requests, k)
	delete(s.deferred, k)
}

// deliverGrant answers the grant waiters of (session, name) with o: the
// armed ones (see Service.armed), or all with all (the session ended).
func (s *Service) deliverGrant(session uint64, name string, o outcome, all bool) {
	byName := s.grants[session]
	kept := byName[name][:0]
	for _, c := range byName[name] {
		if !all && !s.armed[c] {
			kept = append(kept, c)
			continue
		}
		delete(s.armed, c)
		c <- o
	}
	if len(kept) > 0 {
		byName[name] = kept
		return
	}
	delete(byName, name)
	if len(byName) == 0 {
		delete(s.grants, session)
	}
}

// LeaderReady implements raftnode.StateMachine: every session gets a full,
// fresh TTL from now (DESIGN.md invariant 3), so a release is only ever
// delayed by a leader change, never hastened.
func (s *Service) LeaderReady(term uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	s.setReady(true)
	s.term = term
	clear(s.last)
	clear(s.expiring)
	s.timers.clear()
	for _, si := range s.m.Sessions() {
		s.touch(si.ID, time.Duration(si.TTL), now)
	}
	s.log.Info("leader ready", zap.Uint64("term", term), zap.Int("sessions", len(s.last)))
}

// LeaderLost implements raftnode.StateMachine: waiters are answered
// NOT_LEADER so that clients re-send to the next leader.
func (s *Service) LeaderLost() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setReady(false)
	clear(s.last)
	clear(s.expiring)
	clear(s.deferred) // raftnode refuses the held ones (ErrNotLeader)
	clear(s.abandonedOpens)
	clear(s.openInFlight)
	s.timers.clear()
	for k, cs := range s.requests {
		for _, c := range cs {
			c <- outcome{notLeader: true}
		}
		delete(s.requests, k)
	}
	for sess, byName := range s.grants {
		for _, cs := range byName {
			for _, c := range cs {
				c <- outcome{notLeader: true}
			}
		}
		delete(s.grants, sess)
	}
	clear(s.grantOf)
	clear(s.armed)
}

// touch records a heartbeat of session id received at now. A receipt at
// the time of the latest one is queued already: a batch that repeats an ID
// (a KeepAlive message can hold millions) adds one timer entry, not one per
// repetition, each kept for a TTL.
func (s *Service) touch(id uint64, ttl time.Duration, now time.Time) {
	if last, ok := s.last[id]; ok && last.Equal(now) {
		return
	}
	s.last[id] = now
	s.timers.push(id, ttl, now)
}

// expireSoon has the next scan expire session id, which nobody can use
// (see abandonedOpens), unless a receipt (a retried open that returns it,
// a heartbeat) comes first. s.mu is held and s.ready is true.
func (s *Service) expireSoon(id uint64) {
	// At the zero time, which no receipt has: any receipt supersedes it.
	s.last[id] = time.Time{}
	s.timers.push(id, -1, time.Time{}) // due at once: a TTL below zero
}

// abandonOpen records that the proposer of the OpOpenSession request key
// (of open ID openID) stopped waiting for its answer (on reqc): the
// session it opens, if the entry applies, is expired at once (see
// abandonedOpens). An answer that came meanwhile is lost with reqc, so its
// session is expired now, unless the open has an open ID: another attempt
// of it may have got that session since (the entry applied before this
// caller looked at reqc; a retry's entry applied after it found the
// session), or may still get it. Such a session, if no attempt takes it,
// expires after its TTL.
func (s *Service) abandonOpen(key reqKey, reqc chan outcome, openID uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ready {
		return // a leadership that ended: the next one knows nothing of it
	}
	if s.dropRequest(key, reqc) {
		if len(s.requests[key]) == 0 {
			// Nobody else waits (a retry that joined the entry does).
			s.abandonedOpens[key.seq] = struct{}{}
		}
		return
	}
	select {
	case o := <-reqc:
		if !o.notLeader && o.res.Code == fsm.CodeOK && openID == 0 {
			s.expireUnusedLocked(o.res.Session)
		}
	default:
	}
}

// expireUnused expires session id, just opened, whose ID its proposer was
// never told (the call was cancelled as the answer came).
func (s *Service) expireUnused(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ready {
		s.expireUnusedLocked(id)
	}
}

func (s *Service) expireUnusedLocked(id uint64) {
	if _, live := s.m.Session(id); live && !s.expiring[id] {
		s.expireSoon(id)
	}
}

// expireDue proposes one Expire entry for every session whose TTL has passed
// since the last heartbeat this leader received (DESIGN.md invariant 3).
func (s *Service) expireDue() {
	s.mu.Lock()
	if !s.ready {
		s.mu.Unlock()
		return
	}
	now := s.clk.Now()
	var ids []uint64
	s.timers.due(now, func(id uint64, at time.Time) {
		// Only the session's latest heartbeat counts.
		if last, ok := s.last[id]; !ok || !last.Equal(at) || s.expiring[id] {
			return
		}
		if _, ok := s.m.Session(id); !ok {
			return
		}
		ids = append(ids, id)
		s.expiring[id] = true
	})
	term := s.term
	s.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	data := fsm.Encode(&fsm.Command{Op: fsm.OpExpire, IDs: ids, Term: term})
	// Only a definite "not in the log" may unmark the sessions: an entry
	// queued to raft is in the log or refused (Refused), whatever ctx does
	// meanwhile. (Propose's ctx error would not tell: raft may take the
	// entry after the wait ends, and a heartbeat acknowledged "alive" in
	// between would extend a lease past the expiry that then commits.)
	ctx, cancel := context.WithTimeout(context.Background(), 10*s.cfg.ScanInterval)
	defer cancel()
	if err := s.raft.ProposeAsync(ctx, raftnode.AsyncProposal{
		Data:    data,
		Refused: func(error) { s.unmarkExpiring(term, ids) },
	}); err != nil {
		s.unmarkExpiring(term, ids)
		return
	}
	s.log.Debug("proposed expiry", zap.Int("sessions", len(ids)), zap.Uint64("term", term))
	if s.cfg.Hooks.Expired != nil {
		s.cfg.Hooks.Expired(len(ids))
	}
}

// unmarkExpiring lets the next scan propose the expiry of ids again: their
// Expire entry of term is not in the log. (If leadership was lost,
// LeaderLost already cleared the marks.)
func (s *Service) unmarkExpiring(term uint64, ids []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ready || s.term != term {
		return
	}
	for _, id := range ids {
		delete(s.expiring, id)
		if si, ok := s.m.Session(id); ok {
			s.timers.push(id, time.Duration(si.TTL), s.last[id])
		}
	}
}

// Counts returns the number of live sessions and held locks (roles
// included).
func (s *Service) Counts() (sessions, locks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.NumSessions(), s.m.NumLocks()
}

// setReady records a change of leadership readiness and wakes awaitReady
// callers. s.mu must be held.
func (s *Service) setReady(ready bool) {
	s.ready = ready
	close(s.readyC)
	s.readyC = make(chan struct{})
}

// awaitReady is readyCode for a request: at a leader that has not yet
// applied an entry of its term (it becomes ready within one commit round:
// raft thesis §6.4; a new leader's first entry), it waits until the leader
// is ready or deposed, up to ReadyWait, instead of answering UNAVAILABLE at
// once, so that a client that followed the leader change is served as soon
// as possible rather than after its retry backoff. It returns UNAVAILABLE
// if ctx ends or the wait runs out first. At a running replica that knows
// no leader it waits likewise, up to LeaderWait, for one to become known:
// during a leadership transfer the old leader knows none from its vote
// until the new leader's first append, a round trip later, and the other
// followers may still name the old leader, so a caller sent away without
// a hint would bounce between them until its backoff. When that wait runs
// out it returns NOT_LEADER without a hint, so a caller at a cut-off
// replica moves on.
func (s *Service) awaitReady(ctx context.Context) (lockpb.Code, uint64) {
	code, hint := s.readyCode()
	if !s.mayWait(code, hint) {
		return code, hint
	}
	// Each wait has its own bound, from when it begins: a leader not yet
	// ready that is deposed and knows no leader waits at most LeaderWait
	// more, not what is left of ReadyWait.
	var readyT, leaderT *time.Timer
	defer func() {
		for _, t := range []*time.Timer{readyT, leaderT} {
			if t != nil {
				t.Stop()
			}
		}
	}()
	var readyOut, leaderOut <-chan time.Time
	for {
		// Both signals: raftnode reports a lost leadership (readyC) before
		// it publishes the Status naming the new leader (LeaderChanged).
		leaderChanged := s.raft.LeaderChanged()
		s.mu.Lock()
		readyChanged := s.readyC
		s.mu.Unlock()
		if code, hint = s.readyCode(); !s.mayWait(code, hint) {
			return code, hint
		}
		if code == lockpb.Code_CODE_UNAVAILABLE && readyT == nil {
			readyT = time.NewTimer(s.cfg.ReadyWait)
			readyOut = readyT.C
		}
		if code == lockpb.Code_CODE_NOT_LEADER && leaderT == nil {
			leaderT = time.NewTimer(s.cfg.LeaderWait)
			leaderOut = leaderT.C
		}
		select {
		case <-readyChanged:
		case <-leaderChanged:
		case <-ctx.Done():
			return s.readyCode()
		case <-readyOut:
			return s.readyCode()
		case <-leaderOut:
			return s.readyCode()
		case <-s.stopc:
			return s.readyCode()
		case <-s.raft.Done():
			return s.readyCode()
		}
	}
}

// mayWait reports whether a request answered (code, hint) by readyCode
// should wait for a change: at a leader not yet ready (UNAVAILABLE), or at
// a running replica that knows no leader (NOT_LEADER without a hint; a
// stopped replica is answered at once).
func (s *Service) mayWait(code lockpb.Code, hint uint64) bool {
	switch code {
	case lockpb.Code_CODE_UNAVAILABLE:
		return true
	case lockpb.Code_CODE_NOT_LEADER:
		return hint == 0 && !isClosed(s.raft.Done()) && !isClosed(s.stopc)
	}
	return false
}

// readyCode reports whether this replica may take requests now. A replica
// whose raft node has stopped (Close, or a failure such as a failed fsync)
// is answered NOT_LEADER, with the leader it last knew of as the hint but
// never itself: its last Status may still name it the leader, and it will
// not become ready again, so a caller must go elsewhere at once rather
// than wait for ReadyWait or its own deadline.
func (s *Service) readyCode() (lockpb.Code, uint64) {
	st := s.raft.Status()
	select {
	case <-s.raft.Done():
		return lockpb.Code_CODE_NOT_LEADER, otherLeader(st)
	default:
	}
	s.mu.Lock()
	ready := s.ready
	s.mu.Unlock()
	if ready {
		return lockpb.Code_CODE_OK, st.ID
	}
	if st.Leader == st.ID {
		return lockpb.Code_CODE_UNAVAILABLE, st.ID
	}
	return lockpb.Code_CODE_NOT_LEADER, st.Leader
}

// isClosed reports whether c is closed.
func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
