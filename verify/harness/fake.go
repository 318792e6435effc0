package harness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock"
)

// Bug is a deliberately broken behaviour of the Fake lock service, for the
// self-test: each must be reported by the checkers meant to catch it.
type Bug string

// Bugs of the Fake.
const (
	// NoBug is a correct lock service: no checker may fire.
	NoBug Bug = ""
	// DoubleGrant grants a held lock to another session (a third of the
	// time) without checking the holder.
	DoubleGrant Bug = "double-grant"
	// TokenReuse gives a new grant the token of the lock's previous grant.
	TokenReuse Bug = "token-reuse"
	// LostAck acknowledges acquires without recording them: the lock table
	// loses acknowledged writes.
	LostAck Bug = "lost-ack"
	// EarlyExpiry ignores heartbeats: a session expires one TTL after it
	// was opened, while its client, whose heartbeats are acknowledged,
	// still believes it alive.
	EarlyExpiry Bug = "early-expiry"
	// SlowFailover keeps the service unavailable for a second after the
	// leader is lost (a correct failover takes 50 ms).
	SlowFailover Bug = "slow-failover"
)

// Bugs lists every bug.
var Bugs = []Bug{DoubleGrant, TokenReuse, LostAck, EarlyExpiry, SlowFailover}

// Fake is an in-memory lock service with quorumlock's client semantics
// (sessions with client-side leases and heartbeats, FIFO acquire, fenced
// release, settled cancellation), optionally broken by one Bug. It is a
// System for the self-test: the same workload, nemesis, history and
// checkers run against it as against a real cluster. Its "replicas" are
// client processes that can be stopped (their sessions end without a
// close) or isolated (their heartbeats and requests stall); isolating the
// leader makes the service unavailable for a failover.
type Fake struct {
	bug  Bug
	ttl  time.Duration
	stop chan struct{}
	wg   sync.WaitGroup

	mu        sync.Mutex
	rnd       *rand.Rand
	index     uint64
	sessions  map[uint64]*fakeServerSession
	locks     map[string]*fakeLock
	procs     []*fakeProc
	leader    uint64
	downUntil time.Time // unavailable (failover) until then
	refresh   bool      // fresh TTLs due at the end of the failover
}

type fakeServerSession struct {
	ttl  time.Duration
	last time.Time
}

type fakeLock struct {
	holder, token uint64
	last          uint64 // token of the latest grant
	queue         []*fakeWaiter
}

type fakeWaiter struct {
	session uint64
	granted chan uint64 // buffered
}

type fakeProc struct {
	id       uint64
	up       bool
	isolated bool
	sessions map[uint64]*fakeSession
}

// NewFake starts a fake lock service with three processes.
func NewFake(bug Bug, ttl time.Duration, rnd *rand.Rand) *Fake {
	f := &Fake{
		bug: bug, ttl: ttl, stop: make(chan struct{}), rnd: rnd, leader: 1,
		sessions: make(map[uint64]*fakeServerSession), locks: make(map[string]*fakeLock),
	}
	for i := range 3 {
		f.procs = append(f.procs, &fakeProc{id: uint64(i + 1), up: true, sessions: make(map[uint64]*fakeSession)})
	}
	f.wg.Add(1)
	go f.loop()
	return f
}

var (
	errFakeExpired = fmt.Errorf("%w: the cluster ended it (it expired or was revoked)", quorumlock.ErrSessionExpired)
	errFakeLease   = fmt.Errorf("%w: no heartbeat acknowledged within the TTL", quorumlock.ErrSessionExpired)
	errFakeClosed  = fmt.Errorf("%w: closed", quorumlock.ErrSessionExpired)
)

// loop heartbeats the clients' sessions, ends client leases that ran out,
// and expires sessions on the server.
func (f *Fake) loop() {
	defer f.wg.Done()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		f.mu.Lock()
		available := !now.Before(f.downUntil)
		if available && f.refresh {
			// A new leader gives every session a fresh TTL.
			f.refresh = false
			for _, s := range f.sessions {
				s.last = now
			}
		}
		var ended []*fakeSession
		var gone []*fakeSession
		for _, p := range f.procs {
			for _, cs := range p.sessions {
				cs.mu.Lock()
				switch {
				case !now.Before(cs.deadline):
					ended = append(ended, cs)
				case !now.Before(cs.nextSend) && available && !p.isolated:
					ss := f.sessions[cs.id]
					if ss == nil {
						gone = append(gone, cs)
					} else {
						if f.bug != EarlyExpiry {
							ss.last = now
						}
						cs.deadline = now.Add(cs.ttl - cs.ttl/10)
						cs.nextSend = now.Add(cs.ttl / 3)
					}
				}
				cs.mu.Unlock()
			}
		}
		if available {
			var expired []uint64
			for id, s := range f.sessions {
				if now.Sub(s.last) > s.ttl {
					expired = append(expired, id)
				}
			}
			slices.Sort(expired)
			for _, id := range expired {
				f.endLocked(id)
			}
		}
		f.mu.Unlock()
		for _, cs := range ended {
			cs.end(errFakeLease)
			// The best-effort close of a client whose lease ran out.
			cs.remoteClose()
		}
		for _, cs := range gone {
			cs.end(errFakeExpired)
		}
	}
}

// endLocked ends session id on the server: it leaves every queue and its
// locks go to their next waiters.
func (f *Fake) endLocked(id uint64) {
	if _, ok := f.sessions[id]; !ok {
		return
	}
	delete(f.sessions, id)
	names := make([]string, 0, len(f.locks))
	for name := range f.locks {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		l := f.locks[name]
		l.queue = slices.DeleteFunc(l.queue, func(w *fakeWaiter) bool { return w.session == id })
		if l.holder == id {
			f.handOffLocked(l)
		}
	}
}

func (f *Fake) nextToken(l *fakeLock) uint64 {
	f.index++
	if f.bug == TokenReuse && l.last != 0 {
		return l.last
	}
	l.last = f.index
	return f.index
}

func (f *Fake) handOffLocked(l *fakeLock) {
	l.holder, l.token = 0, 0
	for len(l.queue) > 0 {
		w := l.queue[0]
		l.queue = l.queue[1:]
		if _, ok := f.sessions[w.session]; !ok {
			continue
		}
		l.holder, l.token = w.session, f.nextToken(l)
		w.granted <- l.token
		return
	}
}

// wait blocks until the service is available to proc (no failover under
// way, proc up and not isolated), or ctx ends.
func (f *Fake) wait(ctx context.Context, p *fakeProc) error {
	for {
		f.mu.Lock()
		ok := !time.Now().Before(f.downUntil) && (p == nil || (p.up && !p.isolated))
		up := p == nil || p.up
		f.mu.Unlock()
		if !up {
			return errDown
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func (f *Fake) lock(name string) *fakeLock {
	l := f.locks[name]
	if l == nil {
		l = &fakeLock{}
		f.locks[name] = l
	}
	return l
}

// Endpoints implements System.
func (f *Fake) Endpoints() []Endpoint {
	var out []Endpoint
	for _, p := range f.procs {
		out = append(out, fakeEndpoint{f, p})
	}
	return out
}

// Members implements System.
func (f *Fake) Members() []uint64 { return []uint64{1, 2, 3} }

// Clients implements System.
func (f *Fake) Clients() []uint64 { return nil }

// Leader implements System.
func (f *Fake) Leader() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Now().Before(f.downUntil) {
		return 0
	}
	return f.leader
}

// WaitLeader implements System.
func (f *Fake) WaitLeader(d time.Duration) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if f.wait(ctx, nil) != nil {
		return 0
	}
	return f.Leader()
}

// ElectionTimeout implements System.
func (f *Fake) ElectionTimeout() time.Duration { return 100 * time.Millisecond }

// Isolate implements System: the process's heartbeats and requests stall;
// isolating the leader also starts a failover.
func (f *Fake) Isolate(id uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.procs[id-1].isolated = true
	if id == f.leader {
		d := 50 * time.Millisecond
		if f.bug == SlowFailover {
			d = time.Second
		}
		f.downUntil = time.Now().Add(d)
		f.refresh = true
		f.leader = id%3 + 1
	}
}

// Partition, Cut, SetDelay and SetDrop are not modelled by the Fake.
func (f *Fake) Partition(...[]uint64)                  {}
func (f *Fake) Cut(uint64, uint64)                     {}
func (f *Fake) SetDelay(uint64, uint64, time.Duration) {}
func (f *Fake) SetDrop(uint64, uint64, float64)        {}

// Heal implements System.
func (f *Fake) Heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.procs {
		p.isolated = false
	}
}

// Stop implements System: the process's sessions end for their clients
// without a close.
func (f *Fake) Stop(id uint64) {
	f.mu.Lock()
	p := f.procs[id-1]
	p.up = false
	var ss []*fakeSession
	for _, cs := range p.sessions {
		ss = append(ss, cs)
	}
	f.mu.Unlock()
	for _, cs := range ss {
		cs.end(quorumlock.ErrClosed)
	}
}

// Shutdown implements System: the fake has no leadership to hand over, so
// it is Stop.
func (f *Fake) Shutdown(id uint64) { f.Stop(id) }

// Restart implements System.
func (f *Fake) Restart(id uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.procs[id-1].up = true
	return nil
}

// Running implements System.
func (f *Fake) Running() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []uint64
	for _, p := range f.procs {
		if p.up {
			out = append(out, p.id)
		}
	}
	return out
}

// CrashClient implements System (the Fake has no remote clients).
func (f *Fake) CrashClient(int) error { return errors.New("fake: no remote clients") }

// Probe implements System.
func (f *Fake) Probe(ctx context.Context, _ []uint64) error {
	if err := f.wait(ctx, nil); err != nil {
		return err
	}
	f.mu.Lock()
	f.index++
	f.mu.Unlock()
	return nil
}

// LiveSessions implements System.
func (f *Fake) LiveSessions(context.Context) (map[uint64]bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[uint64]bool)
	for id := range f.sessions {
		out[id] = true
	}
	return out, nil
}

// Read implements System.
func (f *Fake) Read(ctx context.Context, name string) (Info, error) {
	return f.holder(ctx, nil, name)
}

func (f *Fake) holder(ctx context.Context, p *fakeProc, name string) (Info, error) {
	if err := f.wait(ctx, p); err != nil {
		return Info{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.lock(name)
	info := Info{Holder: l.holder, Token: l.token}
	for _, w := range l.queue {
		info.Waiters = append(info.Waiters, w.session)
	}
	return info, nil
}

// Close implements System.
func (f *Fake) Close() {
	close(f.stop)
	f.wg.Wait()
}

type fakeEndpoint struct {
	f *Fake
	p *fakeProc
}

func (e fakeEndpoint) Name() string { return fmt.Sprintf("f%d", e.p.id) }

func (e fakeEndpoint) Holder(ctx context.Context, name string) (Info, error) {
	return e.f.holder(ctx, e.p, name)
}

func (e fakeEndpoint) NewSession(ctx context.Context) (Session, error) {
	f := e.f
	sent := time.Now()
	if err := f.wait(ctx, e.p); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !e.p.up {
		return nil, errDown
	}
	f.index++
	id := f.index
	f.sessions[id] = &fakeServerSession{ttl: f.ttl, last: time.Now()}
	cs := &fakeSession{f: f, p: e.p, id: id, ttl: f.ttl, deadline: sent.Add(f.ttl - f.ttl/10), nextSend: sent.Add(f.ttl / 3),
		done: make(chan struct{}), locks: make(map[string]*fakeLockHandle)}
	e.p.sessions[id] = cs
	return cs, nil
}

// fakeSession is the client side of a Fake session.
type fakeSession struct {
	f   *Fake
	p   *fakeProc
	id  uint64
	ttl time.Duration

	mu       sync.Mutex
	deadline time.Time
	nextSend time.Time
	err      error
	done     chan struct{}
	locks    map[string]*fakeLockHandle
}

type fakeLockHandle struct {
	s     *fakeSession
	name  string
	token uint64
	once  sync.Once
	lost  chan struct{}
}

func (s *fakeSession) ID() uint64            { return s.id }
func (s *fakeSession) TTL() time.Duration    { return s.ttl }
func (s *fakeSession) Done() <-chan struct{} { return s.done }

func (s *fakeSession) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

func (s *fakeSession) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// end ends the session for its client.
func (s *fakeSession) end(err error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = err
	locks := s.locks
	s.locks = map[string]*fakeLockHandle{}
	s.mu.Unlock()
	close(s.done)
	for _, l := range locks {
		l.markLost()
	}
	s.f.mu.Lock()
	delete(s.p.sessions, s.id)
	s.f.mu.Unlock()
}

// remoteClose ends the session on the server, in the background, once
// the service is available.
func (s *fakeSession) remoteClose() {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.ttl)
		defer cancel()
		if s.f.wait(ctx, nil) == nil {
			s.f.mu.Lock()
			s.f.endLocked(s.id)
			s.f.mu.Unlock()
		}
	}()
}

func (l *fakeLockHandle) Token() uint64         { return l.token }
func (l *fakeLockHandle) Lost() <-chan struct{} { return l.lost }
func (l *fakeLockHandle) markLost()             { l.once.Do(func() { close(l.lost) }) }

// serverSession checks that the session is alive on both sides.
func (s *fakeSession) serverSessionLocked() error {
	if _, ok := s.f.sessions[s.id]; !ok {
		return errFakeExpired
	}
	return nil
}

func (s *fakeSession) Acquire(ctx context.Context, name string) (Lock, error) {
	return s.acquire(ctx, name, false)
}

func (s *fakeSession) TryAcquire(ctx context.Context, name string) (Lock, error) {
	return s.acquire(ctx, name, true)
}

func (s *fakeSession) acquire(ctx context.Context, name string, try bool) (Lock, error) {
	if err := s.Err(); err != nil {
		return nil, err
	}
	f := s.f
	if err := f.wait(ctx, s.p); err != nil {
		if errors.Is(err, errDown) {
			return nil, err
		}
		return nil, err // nothing was sent: settled as not queued
	}
	f.mu.Lock()
	if err := s.serverSessionLocked(); err != nil {
		f.mu.Unlock()
		s.end(err)
		return nil, err
	}
	l := f.lock(name)
	var token uint64
	switch {
	case l.holder == s.id:
		token = l.token
	case l.holder == 0 || (f.bug == DoubleGrant && f.rnd.IntN(3) == 0):
		token = f.nextToken(l)
		if f.bug != LostAck {
			l.holder, l.token = s.id, token
		}
	case try:
		f.mu.Unlock()
		return nil, fmt.Errorf("%w: %q", quorumlock.ErrLocked, name)
	default:
		w := &fakeWaiter{session: s.id, granted: make(chan uint64, 1)}
		l.queue = append(l.queue, w)
		f.mu.Unlock()
		select {
		case token = <-w.granted:
		case <-ctx.Done():
			f.mu.Lock()
			select {
			case token = <-w.granted:
			default:
				l.queue = slices.DeleteFunc(l.queue, func(x *fakeWaiter) bool { return x == w })
				f.mu.Unlock()
				return nil, ctx.Err()
			}
			f.mu.Unlock()
		}
		return s.granted(name, token)
	}
	f.mu.Unlock()
	return s.granted(name, token)
}

func (s *fakeSession) granted(name string, token uint64) (Lock, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	l := &fakeLockHandle{s: s, name: name, token: token, lost: make(chan struct{})}
	s.locks[name] = l
	return l, nil
}

func (l *fakeLockHandle) Release(ctx context.Context) error {
	s, f := l.s, l.s.f
	if err := s.Err(); err != nil {
		return err
	}
	if err := f.wait(ctx, s.p); err != nil {
		return fmt.Errorf("%w: %w", quorumlock.ErrUnknownOutcome, err)
	}
	f.mu.Lock()
	if err := s.serverSessionLocked(); err != nil {
		f.mu.Unlock()
		s.end(err)
		return err
	}
	fl := f.lock(l.name)
	ok := fl.holder == s.id && fl.token == l.token
	if ok {
		f.handOffLocked(fl)
	}
	f.mu.Unlock()
	s.mu.Lock()
	if s.locks[l.name] == l {
		delete(s.locks, l.name)
	}
	s.mu.Unlock()
	l.markLost()
	if !ok {
		return fmt.Errorf("%w: %q token %d", quorumlock.ErrNotHeld, l.name, l.token)
	}
	return nil
}

func (s *fakeSession) Close(ctx context.Context) error {
	if err := s.Err(); err != nil {
		if errors.Is(err, errFakeClosed) {
			return nil
		}
		return err
	}
	f := s.f
	err := f.wait(ctx, s.p)
	s.end(errFakeClosed)
	if err != nil {
		return fmt.Errorf("%w: %w", quorumlock.ErrUnknownOutcome, err)
	}
	f.mu.Lock()
	f.endLocked(s.id)
	f.mu.Unlock()
	return nil
}
