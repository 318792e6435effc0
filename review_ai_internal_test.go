package quorumlock

// Review AI: a model-based stress test of one session's concurrent calls
// against the real lock table (internal/fsm), through a backend that
// delivers adversarially: late applies, lost answers, leaderless windows.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/service"
)

// tableBackend is a backend over a real fsm.Machine: commands are applied
// one at a time under mu with increasing indexes (the token of a grant is
// its index, as in the real table), and answered as internal/service
// answers them: a waiting acquire (not Try, not NoWait) answered Queued
// waits for the grant of the session's place (EventGranted), the end of
// the session (NO_SESSION) or ctx's end; a place withdrawn is not
// answered, as the service does not answer it (the caller's ctx ends).
//
// With adversarial set, delivery is drawn from a seeded source: a command
// may reach the table after a delay (requests of one session reorder, and
// one may be applied after its caller gave up: late), its answer may be
// lost (the caller waits until its ctx ends or, like the router after a
// lost leader, sends a copy of the same request, which the table answers
// with the remembered outcome), and setLeader(false) opens a window where
// nothing is applied or answered (a waiting acquire's copy is sent again
// once a leader is back, as the router does after NOT_LEADER).
type tableBackend struct {
	grace       time.Duration
	adversarial atomic.Bool

	rmu sync.Mutex
	rnd *rand.Rand // guarded by rmu

	pending sync.WaitGroup // commands on their way to the table
	clock   atomic.Int64   // orders the test's events: answers, returns

	mu      sync.Mutex
	m       *fsm.Machine
	index   uint64
	leader  bool
	up      chan struct{} // closed while a leader is up
	lost    chan struct{} // closed when the current leadership ends
	grants  map[uint64]map[string][]*tableWaiter
	tokens  map[string]uint64 // the last grant of each name
	trace   []string          // the last applied commands (for a failure report)
	bad     []string          // violations found while applying
	nonce   uint64
	kinds   map[string]int       // commands applied by kind, for the log
	waiting map[*aiCall]struct{} // test calls in their waiting acquire's propose
	held    map[aiHold]bool      // grants calls returned and hold (no Release started)
}

// tableWaiter is one copy of a request waiting for its answer.
type tableWaiter struct {
	grant   chan fsm.Result // the grant of a queued acquire (or NO_SESSION)
	lost    chan struct{}   // the leadership the acquire was queued under
	dropped bool            // the caller stopped waiting (guarded by mu)
}

// aiCallKey is the context key of a test call's aiCall: the backend
// finds it in the contexts of the call's requests (not in those of the
// session's background settling).
type aiCallKey struct{}

// aiCall is what the backend saw of one test call's waiting acquire
// (guarded by tableBackend.mu).
type aiCall struct {
	session uint64
	name    string
	applied uint64 // the index its first copy was applied at
	waiting bool   // its waiting acquire is in propose now
	// answered is when (tableBackend.clock) the call's last answer came.
	answered int64
}

// tableDelivery is how one request travels (see tableBackend).
type tableDelivery struct {
	delay  time.Duration // before it reaches the table
	late   bool          // applied even if its caller's ctx ended on the way
	lose   bool          // its answer is lost
	resend time.Duration // after a lost answer, a copy is sent (if ctx lives)
}

const tableTraceLen = 5000

func newTableBackend(seed uint64, grace time.Duration) *tableBackend {
	up := make(chan struct{})
	close(up)
	return &tableBackend{
		grace:   grace,
		rnd:     rand.New(rand.NewPCG(seed, 0x5eed)),
		m:       fsm.New(fsm.Limits{}),
		leader:  true,
		up:      up,
		lost:    make(chan struct{}),
		grants:  make(map[uint64]map[string][]*tableWaiter),
		tokens:  make(map[string]uint64),
		kinds:   make(map[string]int),
		waiting: make(map[*aiCall]struct{}),
		held:    make(map[aiHold]bool),
	}
}

func (b *tableBackend) settleGrace() time.Duration { return b.grace }

// keepAlive: leases are not the subject; every session stays alive.
func (b *tableBackend) keepAlive(ctx context.Context, ids []uint64) ([]uint64, []uint64, error) {
	return ids, nil, nil
}

// setLeader opens (false) or ends (true) a leaderless window.
func (b *tableBackend) setLeader(up bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case up && !b.leader:
		b.leader = true
		b.lost = make(chan struct{})
		close(b.up)
	case !up && b.leader:
		b.leader = false
		close(b.lost)
		b.up = make(chan struct{})
	}
}

func (b *tableBackend) plan(background bool) tableDelivery {
	if !b.adversarial.Load() {
		return tableDelivery{}
	}
	b.rmu.Lock()
	defer b.rmu.Unlock()
	var d tableDelivery
	switch b.rnd.IntN(20) {
	case 0: // a long way
		d.delay = time.Duration(5000+b.rnd.IntN(15000)) * time.Microsecond
	case 1, 2, 3, 4, 5, 6:
		d.delay = time.Duration(b.rnd.IntN(4000)) * time.Microsecond
	}
	if background && b.rnd.IntN(2) == 0 {
		// The session's own requests (background settling, its
		// releases) are where the rare interleavings are: slow them.
		d.delay = time.Duration(1000+b.rnd.IntN(15000)) * time.Microsecond
	}
	d.late = b.rnd.IntN(2) == 0
	if b.rnd.IntN(16) == 0 {
		d.lose = true
		d.resend = time.Duration(5+b.rnd.IntN(40)) * time.Millisecond
	}
	return d
}

// tableCommand is the command of req, as internal/service builds it
// (service.Command), with an open's nonce from the backend's counter.
func (b *tableBackend) tableCommand(req *lockpb.Request) (cmd fsm.Command, waitGrant bool, invalid *lockpb.Response) {
	cmd, waitGrant, invalid = service.Command(req)
	if invalid == nil && cmd.Op == fsm.OpOpenSession {
		b.mu.Lock()
		b.nonce++
		cmd.Nonce = b.nonce
		b.mu.Unlock()
	}
	return cmd, waitGrant, invalid
}

func (b *tableBackend) propose(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
	cmd, waitGrant, invalid := b.tableCommand(req)
	if invalid != nil {
		return invalid, nil
	}
	call, fg := ctx.Value(aiCallKey{}).(*aiCall)
	dl := b.plan(!fg)
	tc := call // the test call of every request (nil: the session's own)
	if !waitGrant {
		call = nil
	}
	if call != nil {
		b.mu.Lock()
		call.session, call.name, call.waiting = cmd.Session, cmd.Name, true
		b.waiting[call] = struct{}{}
		b.mu.Unlock()
		defer func() {
			b.mu.Lock()
			call.waiting = false
			delete(b.waiting, call)
			b.mu.Unlock()
		}()
	}
	answer := func(r fsm.Result) (*lockpb.Response, error) {
		b.mu.Lock()
		if tc != nil {
			tc.answered = b.clock.Add(1)
		}
		where := "background "
		if fg {
			where = ""
		}
		switch {
		case req.GetNoWait():
			b.kinds[fmt.Sprintf("%srecheck code %d", where, r.Code)]++
		case cmd.Op == fsm.OpRelease && !fg && r.Code == fsm.CodeOK:
			b.kinds["background release"]++
		}
		b.mu.Unlock()
		return service.ResponseOf(r), nil
	}
	for {
		w := &tableWaiter{grant: make(chan fsm.Result, 1)}
		resc := make(chan fsm.Result, 1)
		b.pending.Add(1)
		go func() {
			defer b.pending.Done()
			b.applyLater(ctx, cmd, waitGrant, req.GetNoWait(), fg, dl, w, call, resc)
		}()
		var res fsm.Result
		select {
		case res = <-resc:
		case <-ctx.Done():
			b.drop(w)
			return nil, ctx.Err()
		}
		if res.Code == fsm.CodeQueued && waitGrant {
			select {
			case res = <-w.grant:
			case <-ctx.Done():
				b.drop(w)
				return nil, ctx.Err()
			case <-w.lost:
				// NOT_LEADER: the router sends the same request again.
				b.drop(w)
				dl = tableDelivery{}
				continue
			}
		}
		if dl.lose {
			// The answer is lost; the router sends the same request
			// again after a while, if ctx lives.
			t := time.NewTimer(dl.resend)
			select {
			case <-ctx.Done():
				t.Stop()
				b.drop(w)
				return nil, ctx.Err()
			case <-t.C:
			}
			b.drop(w)
			dl = tableDelivery{}
			continue
		}
		return answer(res)
	}
}

// applyLater applies cmd after dl.delay, once a leader is up, unless the
// caller's ctx ended on the way and dl.late is false (never proposed).
func (b *tableBackend) applyLater(ctx context.Context, cmd fsm.Command, waitGrant, noWait, fg bool, dl tableDelivery, w *tableWaiter, call *aiCall, resc chan<- fsm.Result) {
	if dl.delay > 0 {
		time.Sleep(dl.delay)
	}
	for {
		b.mu.Lock()
		if ctx.Err() != nil && !dl.late {
			b.mu.Unlock()
			return
		}
		if b.leader {
			res := b.applyLocked(&cmd, noWait)
			if call != nil && call.applied == 0 {
				call.applied = b.index
			}
			if cmd.Op == fsm.OpRelease && !fg && res.Code == fsm.CodeOK {
				b.releasedInBackgroundLocked(&cmd)
			}
			if res.Code == fsm.CodeQueued && waitGrant && !w.dropped {
				byName := b.grants[cmd.Session]
				if byName == nil {
					byName = make(map[string][]*tableWaiter)
					b.grants[cmd.Session] = byName
				}
				byName[cmd.Name] = append(byName[cmd.Name], w)
				w.lost = b.lost
			}
			b.mu.Unlock()
			resc <- res
			return
		}
		up := b.up
		b.mu.Unlock()
		select {
		case <-up:
		case <-ctx.Done():
			if !dl.late {
				return
			}
			<-up
		}
	}
}

// drop forgets w: its caller stopped waiting.
func (b *tableBackend) drop(w *tableWaiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	w.dropped = true
	for id, byName := range b.grants {
		for name, ws := range byName {
			if i := slices.Index(ws, w); i >= 0 {
				byName[name] = slices.Delete(ws, i, i+1)
				if len(byName[name]) == 0 {
					delete(byName, name)
				}
				if len(byName) == 0 {
					delete(b.grants, id)
				}
				return
			}
		}
	}
}

var tableOps = map[fsm.Op]string{fsm.OpOpenSession: "open", fsm.OpAcquire: "acquire", fsm.OpRelease: "release", fsm.OpWithdraw: "withdraw", fsm.OpCloseSession: "close"}

// applyLocked applies cmd as the next entry; b.mu is held.
func (b *tableBackend) applyLocked(cmd *fsm.Command, noWait bool) fsm.Result {
	b.index++
	res, evs := b.m.Apply(b.index, 1, cmd)
	line := fmt.Sprintf("%d: s%d #%d %s %q try=%v nowait=%v target=%d token=%d -> code %d token %d", b.index, cmd.Session, cmd.Seq, tableOps[cmd.Op], cmd.Name, cmd.Try, noWait, cmd.Target, cmd.Token, res.Code, res.Token)
	switch {
	case cmd.Op == fsm.OpAcquire && res.Code == fsm.CodeQueued:
		b.kinds["queued"]++
	case cmd.Op == fsm.OpWithdraw && cmd.Name == "":
		b.kinds["take back"]++
	case cmd.Op == fsm.OpWithdraw:
		b.kinds["withdraw place"]++
	case cmd.Op == fsm.OpAcquire && res.Code == fsm.CodeWithdrawn:
		b.kinds["acquire taken back"]++
	}
	if cmd.Op == fsm.OpAcquire && res.Code == fsm.CodeOK && res.Token == b.index {
		b.grantedLocked(cmd.Session, cmd.Name, res.Token)
	}
	for _, ev := range evs {
		switch ev.Kind {
		case fsm.EventGranted:
			line += fmt.Sprintf("; granted %q to s%d (%d)", ev.Name, ev.Session, ev.Token)
			b.grantedLocked(ev.Session, ev.Name, ev.Token)
			for _, w := range b.grants[ev.Session][ev.Name] {
				w.grant <- fsm.Result{Code: fsm.CodeOK, Token: ev.Token}
			}
			delete(b.grants[ev.Session], ev.Name)
		case fsm.EventSessionEnded:
			line += fmt.Sprintf("; s%d ended", ev.Session)
			for _, ws := range b.grants[ev.Session] {
				for _, w := range ws {
					w.grant <- fsm.Result{Code: fsm.CodeNoSession}
				}
			}
			delete(b.grants, ev.Session)
		}
	}
	b.traceLocked(line)
	return res
}

// grantedLocked checks that tokens of a name only grow across grants.
func (b *tableBackend) grantedLocked(session uint64, name string, token uint64) {
	if token <= b.tokens[name] {
		b.bad = append(b.bad, fmt.Sprintf("%q granted to s%d with token %d after token %d", name, session, token, b.tokens[name]))
	}
	b.tokens[name] = token
}

// releasedInBackgroundLocked checks a release the session sent on its own
// (releaseUnwanted: no test call's context) of a grant it found after its
// caller had been told it did not get the lock: no call of the session may
// still wait for the name in a request applied before that grant (the
// grant may be the one of the place that call waits in, which is that
// call's: leaveGrantToWaiting). A call in its waiting acquire's propose
// has not stopped waiting. Nor may a call hold the grant: one answered
// with it while the release is on its way must not return it (the
// released mark). b.mu is held.
func (b *tableBackend) releasedInBackgroundLocked(cmd *fsm.Command) {
	if b.held[aiHold{cmd.Session, cmd.Name, Token(cmd.Token)}] {
		b.bad = append(b.bad, fmt.Sprintf("s%d released %q token %d in the background, a grant a call returned and holds", cmd.Session, cmd.Name, cmd.Token))
	}
	for c := range b.waiting {
		if c.session == cmd.Session && c.name == cmd.Name && c.applied != 0 && c.applied < cmd.Token {
			b.bad = append(b.bad, fmt.Sprintf("s%d released %q token %d in the background while a call (queued at %d) still waits for it", cmd.Session, cmd.Name, cmd.Token, c.applied))
		}
	}
}

func (b *tableBackend) traceLocked(line string) {
	if len(b.trace) == tableTraceLen {
		b.trace = b.trace[1:]
	}
	b.trace = append(b.trace, line)
}

// note adds a line (a call's outcome) to the trace.
func (b *tableBackend) note(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.traceLocked(fmt.Sprintf(format, args...))
}

// newTableHarness opens two sessions on a tableBackend with the seed
// (calm delivery while opening; adversarial from then on).
func newTableHarness(t *testing.T, seed uint64) (*tableBackend, *Session, *Session) {
	t.Helper()
	clk := clock.NewManual(time.Unix(5000, 0)) // never advanced: leases never run out
	be := newTableBackend(seed, 30*time.Millisecond)
	closed := make(chan struct{})
	hb := newHeartbeater(be, clk, closed)
	hb.start()
	t.Cleanup(func() {
		be.setLeader(true)
		close(closed)
		hb.wait()
		be.pending.Wait()
	})
	open := func() *Session {
		s, err := openSession(context.Background(), be, newOpenCalls(), hb, clk, 10*time.Second, 256)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, other := open(), open()
	be.adversarial.Store(true)
	return be, a, other
}

// aiHold identifies one grant a test call holds.
type aiHold struct {
	session uint64
	name    string
	token   Token
}

// aiModel is the test's view of which grants the calls hold, checked
// against the table at every successful return.
type aiModel struct {
	be *tableBackend

	mu        sync.Mutex
	holds     map[aiHold]int   // calls holding the grant now
	releasing map[aiHold]bool  // a call started releasing the grant
	released  map[aiHold]int64 // a call's Release of the grant returned (tableBackend.clock)
	bad       []string
	outcomes  map[string]int // by kind, for the log: what the run covered
}

func (m *aiModel) count(kind string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.outcomes[kind]++
}

func (m *aiModel) fail(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.bad = append(m.bad, fmt.Sprintf(format, args...))
}

// returned checks an Acquire's or TryAcquire's outcome and registers a
// returned grant as held by the call.
func (m *aiModel) returned(s *Session, name string, try bool, call *aiCall, l *Lock, err error) {
	what := "Acquire"
	if try {
		what = "TryAcquire"
	}
	if err != nil {
		m.be.note("s%d %s %q returned %v", s.id, what, name, err)
		switch {
		case errors.Is(err, ErrWithdrawPending):
			m.count("withdraw pending")
		case errors.Is(err, ErrNotHeld):
			m.count("not held")
		case errors.Is(err, ErrLocked):
			m.count("locked")
		default:
			m.count("ctx")
		}
		switch {
		case errors.Is(err, ErrLocked), errors.Is(err, ErrNotHeld),
			errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		default:
			m.fail("s%d %s %q: unexpected error %v", s.id, what, name, err)
		}
		if l != nil {
			m.fail("s%d %s %q returned a Lock with error %v", s.id, what, name, err)
		}
		return
	}
	if l == nil || l.name != name || l.s != s {
		m.fail("s%d %s %q returned %v with a nil error", s.id, what, name, l)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	h := aiHold{s.id, name, l.token}
	m.be.mu.Lock()
	li := m.be.m.Holder(name)
	var answered int64
	if call != nil {
		answered = call.answered
	}
	m.be.held[h] = true
	m.be.traceLocked(fmt.Sprintf("s%d %s %q returned token %d (table: s%d token %d waiters %v)", s.id, what, name, l.token, li.Holder, li.Token, li.Waiters))
	m.be.mu.Unlock()
	if r := m.released[h]; r != 0 && r < answered {
		// The Release dropped the Lock before the answer came: granted
		// must refuse the grant (ErrNotHeld).
		m.bad = append(m.bad, fmt.Sprintf("s%d %s %q returned token %d, answered after a Release of that grant had returned", s.id, what, name, l.token))
	}
	if !(li.Holder == s.id && Token(li.Token) == l.token) && !m.releasing[h] {
		m.bad = append(m.bad, fmt.Sprintf("s%d %s %q returned token %d; the table shows s%d holding token %d, and no call released it", s.id, what, name, l.token, li.Holder, li.Token))
	}
	for o, n := range m.holds {
		// (A grant a call of the session released before this return
		// is not held: the call returned it late, which is allowed.)
		if !m.releasing[h] && o.name == name && o.session != s.id && n > 0 && !m.releasing[o] {
			m.bad = append(m.bad, fmt.Sprintf("s%d %s %q returned token %d while a call of s%d holds token %d (not released)", s.id, what, name, l.token, o.session, o.token))
		}
	}
	m.holds[h]++
	m.outcomes["granted"]++
}

// release releases l for a call that held it (until settled: a Release
// whose outcome is unknown is called again).
func (m *aiModel) release(l *Lock) {
	h := aiHold{l.s.id, l.name, l.token}
	m.mu.Lock()
	m.releasing[h] = true
	m.holds[h]--
	m.be.mu.Lock()
	delete(m.be.held, h)
	m.be.mu.Unlock()
	m.mu.Unlock()
	for range 50 {
		ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), aiCallKey{}, (*aiCall)(nil)), 200*time.Millisecond)
		err := l.Release(ctx)
		cancel()
		m.be.note("s%d Release %q token %d: %v", l.s.id, l.name, l.token, err)
		switch {
		case err == nil, errors.Is(err, ErrNotHeld):
			m.mu.Lock()
			if m.released[h] == 0 {
				m.released[h] = m.be.clock.Add(1)
			}
			m.mu.Unlock()
			return
		case errors.Is(err, ErrUnknownOutcome):
			continue
		default:
			m.fail("s%d Release %q token %d: %v", l.s.id, l.name, l.token, err)
			return
		}
	}
	m.fail("s%d Release %q token %d never settled", l.s.id, l.name, l.token)
}

// aiEnv reads a positive integer from the environment variable key.
func aiEnv(key string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(key)); err == nil && v > 0 {
		return v
	}
	return def
}

// aiPhase is one phase of aiRun: the calls run until done reaches upTo
// (or the deadline), then, once every call returned, every background
// settling is done and every command on its way applied, the table is
// checked against both sessions.
func aiPhase(be *tableBackend, model *aiModel, a, other *Session, seed uint64, phase, workers int, upTo int64, done *atomic.Int64, names []string, deadline time.Time) {
	var wg sync.WaitGroup
	worker := func(s *Session, i int, minWait, maxWait, hold int) {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, uint64(phase)<<32|uint64(i+1)))
		for done.Add(1) <= upTo && time.Now().Before(deadline) {
			name := names[rng.IntN(len(names))]
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(minWait+rng.IntN(maxWait-minWait+1))*time.Millisecond)
			if rng.IntN(6) == 0 {
				// A cancellation before the deadline.
				time.AfterFunc(time.Duration(rng.IntN(maxWait*1000))*time.Microsecond, cancel)
			}
			try := rng.IntN(5) == 0
			call := &aiCall{}
			ctx = context.WithValue(ctx, aiCallKey{}, call)
			var l *Lock
			var err error
			if try {
				l, err = s.TryAcquire(ctx, name)
			} else {
				l, err = s.Acquire(ctx, name)
			}
			cancel()
			model.returned(s, name, try, call, l, err)
			if l != nil {
				if d := rng.IntN(hold * 1000); d > 0 {
					time.Sleep(time.Duration(d) * time.Microsecond)
				}
				model.release(l)
			}
		}
		done.Add(-1) // the count that stopped the loop
	}
	for i := range workers {
		wg.Add(1)
		go worker(a, i, 1, 40, 2)
	}
	for i := range 2 {
		wg.Add(1)
		go worker(other, 100+i, 10, 60, 15)
	}
	// Leaderless windows, long enough to push settling into the
	// background (settleGrace is 30 ms).
	chaosDone := make(chan struct{})
	var chaos sync.WaitGroup
	chaos.Add(1)
	go func() {
		defer chaos.Done()
		rng := rand.New(rand.NewPCG(seed, uint64(phase)<<32|0xc4a05))
		for {
			select {
			case <-chaosDone:
				return
			case <-time.After(time.Duration(10+rng.IntN(150)) * time.Millisecond):
			}
			be.setLeader(false)
			select {
			case <-chaosDone:
			case <-time.After(time.Duration(40+rng.IntN(80)) * time.Millisecond):
			}
			be.setLeader(true)
		}
	}()
	wg.Wait()
	close(chaosDone)
	chaos.Wait()
	be.setLeader(true)

	// Quiescence: every call returned, every background settling done,
	// every command on its way applied.
	quiet := time.Now().Add(10 * time.Second)
	for !(bookkeepingClear(a) && bookkeepingClear(other)) {
		if time.Now().After(quiet) {
			model.fail("phase %d: no quiescence in 10 s: a in flight %v, other in flight %v", phase, inflightOf(a), inflightOf(other))
			break
		}
		time.Sleep(time.Millisecond)
	}
	be.pending.Wait()

	for _, s := range []*Session{a, other} {
		if err := s.Err(); err != nil {
			model.fail("phase %d: s%d ended: %v", phase, s.id, err)
		}
		be.mu.Lock()
		var table []string
		for _, li := range be.m.SessionLocks(s.id) {
			table = append(table, fmt.Sprintf("%s:%d", li.Name, li.Token))
		}
		var queued []string
		for _, name := range names {
			if slices.Contains(be.m.Holder(name).Waiters, s.id) {
				queued = append(queued, name)
			}
		}
		be.traceLocked(fmt.Sprintf("phase %d checked", phase))
		be.mu.Unlock()
		var known []string
		for _, l := range s.Locks() {
			known = append(known, fmt.Sprintf("%s:%d", l.name, l.token))
		}
		if !slices.Equal(table, known) {
			model.fail("phase %d: s%d: the table shows it holding %v; the session knows %v", phase, s.id, table, known)
		}
		if len(queued) > 0 {
			model.fail("phase %d: s%d: queued for %v with no call waiting", phase, s.id, queued)
		}
	}
}

// aiRun is one seeded run: workers calls of session a (Acquire,
// TryAcquire, Release) on names, while calls of session other hold and
// release the same names so that a's calls queue, and leaderless windows
// come and go; ops operations in all, in phases (aiPhase). It returns the
// violations found (none: nil).
func aiRun(t *testing.T, seed uint64, workers, ops int, names []string, budget time.Duration) []string {
	be, a, other := newTableHarness(t, seed)
	model := &aiModel{be: be, holds: make(map[aiHold]int), releasing: make(map[aiHold]bool), released: make(map[aiHold]int64), outcomes: make(map[string]int)}
	deadline := time.Now().Add(budget)
	var done atomic.Int64
	// The run goes in phases, each ended by quiescence and its checks: a
	// grant or a place no call knows of is seen before a later call of
	// the name takes it over.
	const phases = 5
	for phase := range phases {
		aiPhase(be, model, a, other, seed, phase, workers, int64(ops*(phase+1)/phases), &done, names, deadline)
		model.mu.Lock()
		be.mu.Lock()
		failed := len(model.bad)+len(be.bad) > 0
		be.mu.Unlock()
		model.mu.Unlock()
		if failed || !time.Now().Before(deadline) {
			break
		}
	}
	be.mu.Lock()
	bad := append(slices.Clone(be.bad), model.bad...)
	trace := slices.Clone(be.trace)
	be.mu.Unlock()
	if len(bad) > 0 {
		if path := os.Getenv("QL_AI_TRACE"); path != "" {
			if err := os.WriteFile(fmt.Sprintf("%s.%d", path, seed), []byte(strings.Join(trace, "\n")+"\n"), 0o644); err != nil {
				t.Log(err)
			}
		}
		t.Logf("seed %d: last %d trace lines:\n%s", seed, min(len(trace), 200), strings.Join(trace[max(0, len(trace)-200):], "\n"))
	}
	model.mu.Lock()
	be.mu.Lock()
	t.Logf("seed %d: %d operations, %d entries %v, outcomes %v", seed, done.Load(), be.index, be.kinds, model.outcomes)
	be.mu.Unlock()
	model.mu.Unlock()
	return bad
}

func inflightOf(s *Session) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("seqs %d, calls %d, names %d", len(s.inflight), len(s.calls), len(s.acquiring))
}

// TestReviewAISharedSessionModel drives one session's concurrent calls
// (Acquire, TryAcquire, Release; random timeouts and cancellations) on
// two to five names against the real lock table, with a second session holding
// the same names so that calls queue, under adversarial delivery (late
// applies, lost answers, leaderless windows). It checks at every
// successful return that the table shows the session holding the grant
// returned (or a call of the session released it meanwhile), that no
// call of the other session holds the name, and that no Release of that
// grant had returned before the answer came (granted's released mark);
// that tokens only grow; that the session never releases in the
// background a grant a call holds, or one a call still waits for in a
// request queued before it; and at quiescence that the table's holdings
// of each session are its Locks() (same tokens), that neither session is
// queued anywhere, and that both live. Every run logs its seed and what
// it covered; QL_AI_SEEDS (default 4), QL_AI_SEED (first seed, default
// 1) and QL_AI_OPS (operations per seed, default 600) make longer runs,
// and QL_AI_TRACE=path writes a failing seed's trace to path.SEED. A
// seed fixes every random choice, not the goroutines' schedule: a
// failure it finds is reproduced by a scripted test (below).
//
// Found so far: TestReviewAIReleasedMarkOutlivesTheCalls and
// TestReviewAILeftPlaceQueuedAgainAfterItsWithdrawal.
func TestReviewAISharedSessionModel(t *testing.T) {
	t.Parallel()
	seeds := aiEnv("QL_AI_SEEDS", 4)
	first := aiEnv("QL_AI_SEED", 1)
	ops := aiEnv("QL_AI_OPS", 600)
	start := time.Now()
	for i := range seeds {
		if time.Since(start) > 20*time.Second && os.Getenv("QL_AI_SEEDS") == "" {
			break
		}
		seed := uint64(first + i)
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			workers := 4 + int(seed%5) // 4..8
			for _, bad := range aiRun(t, seed, workers, ops, []string{"a", "b", "c", "d", "e"}[:2+int(seed%4)], 8*time.Second) {
				t.Error(bad)
			}
		})
	}
}

// A grant a background recheck finds after its caller was told no is
// released (releaseUnwanted), and until that release applies, an acquire
// of the name answered with the grant returns ErrNotHeld (the released
// mark). The mark lives in the name's acquire bookkeeping, which the last
// call of the name to exit deleted while the release was still in flight:
// the next Acquire, answered with the grant, returned it as held, and the
// release then freed it under the caller (the session listed a lock the
// cluster had given away). Found by TestReviewAISharedSessionModel (the
// release of a grant three calls had just returned was applied late).
//
// Script: Y waits for x; TryAcquire X beside it stops (cancelled) and
// takes back its own request, with no leader to answer it
// (ErrWithdrawPending); Y stops and withdraws the place. A leader is
// back: the take-back is answered, the recheck finds X's request granted
// 9 (the lock was free), and the release of 9 is held on its way. Two
// Acquires of x are then answered with 9 (the session holds it): the
// first must get ErrNotHeld, and so must the second.
func TestReviewAIReleasedMarkOutlivesTheCalls(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	var (
		mu        sync.Mutex
		held9     bool
		acquires  int
		releases  int
		takeBacks int
	)
	quorum, releaseGate := make(chan struct{}), make(chan struct{})
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		mu.Lock()
		switch {
		case req.GetOp() == lockpb.Op_OP_ACQUIRE && req.GetNoWait():
			// The recheck of X's request: applied on the free lock.
			held9 = true
			mu.Unlock()
			return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 9}, nil
		case req.GetOp() == lockpb.Op_OP_ACQUIRE:
			acquires++
			h := held9
			mu.Unlock()
			if h {
				// The session holds x: the grant.
				return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 9}, nil
			}
			// Y and X: queued behind another session, no answer.
			<-ctx.Done()
			return nil, ctx.Err()
		case req.GetOp() == lockpb.Op_OP_WITHDRAW && req.GetName() == "":
			takeBacks++
			mu.Unlock()
			return answerWhen(ctx, quorum, &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN})
		case req.GetOp() == lockpb.Op_OP_WITHDRAW:
			mu.Unlock()
			return &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}, nil
		case req.GetOp() == lockpb.Op_OP_RELEASE && req.GetToken() == 9:
			releases++
			mu.Unlock()
			select {
			case <-releaseGate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			mu.Lock()
			held9 = false
			mu.Unlock()
			return &lockpb.Response{Code: lockpb.Code_CODE_OK, Token: 9}, nil
		}
		mu.Unlock()
		return nil, errors.New("unexpected request")
	}
	be.mu.Unlock()
	count := func(n *int) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return *n > 0 }
	}

	yctx, ycancel := context.WithCancel(context.Background())
	defer ycancel()
	yErr := make(chan acquireResult, 1)
	go func() {
		l, err := s.Acquire(yctx, "x")
		yErr <- acquireResult{l, err}
	}()
	eventually(t, "Y waiting", count(&acquires))
	xctx, xcancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); xcancel() }()
	if _, err := s.TryAcquire(xctx, "x"); !errors.Is(err, ErrWithdrawPending) {
		t.Fatalf("TryAcquire X whose take-back no leader answered: %v, want ErrWithdrawPending", err)
	}
	ycancel()
	if _, err := receive(t, yErr); !errors.Is(err, context.Canceled) {
		t.Fatalf("Y: %v, want context.Canceled", err)
	}
	close(quorum)
	eventually(t, "the release of the unwanted grant 9 on its way", count(&releases))
	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l, err := s.Acquire(ctx, "x")
		cancel()
		if err == nil {
			t.Errorf("Acquire %d, answered while the release of 9 is on its way: got token %d, want ErrNotHeld", i+1, l.Token())
		} else if !errors.Is(err, ErrNotHeld) {
			t.Fatalf("Acquire %d: %v, want ErrNotHeld", i+1, err)
		}
	}
	close(releaseGate)
	eventually(t, "the background settling finished", func() bool { return bookkeepingClear(s) })
	mu.Lock()
	defer mu.Unlock()
	for _, l := range s.Locks() {
		if !held9 || l.Token() != 9 {
			t.Errorf("the session lists %s token %d; the cluster holds 9 for it: %v", l.Name(), l.Token(), held9)
		}
	}
}

// A call Q that stops waiting beside a waiting call P leaves the place to
// P and takes back its own request only. If P then stops too and
// withdraws the place by name, and Q's request (on its way) is applied
// after that withdrawal and before Q's take-back, it queues the session
// again: Q's recheck finds its request queued. No call waits for the
// name any more, so Q must withdraw the place; before, it did so only
// when the place was owed to it (placeOwed, which P's withdrawal
// cleared), and the session stayed queued with no call to take the grant
// (found by TestReviewAISharedSessionModel, GOMAXPROCS=1, seed 242: "the
// table shows it holding [a:1211]; the session knows []"). The background
// settling (settleLater) already withdrew such a place.
func TestReviewAILeftPlaceQueuedAgainAfterItsWithdrawal(t *testing.T) {
	be, _, s := newLeaseHarness(t, true)
	var (
		mu       sync.Mutex
		queued   bool   // the session's place in x's queue
		pSeq     uint64 // P's acquire
		qSeq     uint64 // Q's acquire
		qApplied bool
		byName   int // withdrawals of the place
	)
	gateQ, takeBackGate := make(chan struct{}), make(chan struct{})
	be.mu.Lock()
	be.handle = func(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
		mu.Lock()
		switch {
		case req.GetOp() == lockpb.Op_OP_ACQUIRE && req.GetNoWait():
			// Q's recheck: its request was applied; its outcome now.
			q := queued
			mu.Unlock()
			if q {
				return &lockpb.Response{Code: lockpb.Code_CODE_OK, Queued: true}, nil
			}
			return &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}, nil
		case req.GetOp() == lockpb.Op_OP_ACQUIRE && pSeq == 0:
			pSeq, queued = req.GetSeq(), true // behind another session
			mu.Unlock()
			<-ctx.Done()
			return nil, ctx.Err()
		case req.GetOp() == lockpb.Op_OP_ACQUIRE:
			qSeq = req.GetSeq()
			mu.Unlock()
			go func() { // on its way: applied once gateQ opens
				<-gateQ
				mu.Lock()
				queued, qApplied = true, true
				mu.Unlock()
			}()
			<-ctx.Done()
			return nil, ctx.Err()
		case req.GetOp() == lockpb.Op_OP_WITHDRAW && req.GetName() == "":
			mu.Unlock()
			// Q's take-back: applied after Q's request, so it takes
			// nothing back.
			return answerWhen(ctx, takeBackGate, &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN})
		case req.GetOp() == lockpb.Op_OP_WITHDRAW:
			byName++
			queued = false
			mu.Unlock()
			return &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}, nil
		}
		mu.Unlock()
		return nil, errors.New("unexpected request")
	}
	be.mu.Unlock()
	state := func(f func() bool) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return f() }
	}

	pctx, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	pErr := make(chan acquireResult, 1)
	go func() {
		l, err := s.Acquire(pctx, "x")
		pErr <- acquireResult{l, err}
	}()
	eventually(t, "P waiting", state(func() bool { return pSeq != 0 }))
	qctx, qcancel := context.WithCancel(context.Background())
	defer qcancel()
	qErr := make(chan acquireResult, 1)
	go func() {
		l, err := s.Acquire(qctx, "x")
		qErr <- acquireResult{l, err}
	}()
	eventually(t, "Q's request on its way", state(func() bool { return qSeq != 0 }))
	qcancel() // Q leaves the place to P and takes back its request
	eventually(t, "Q leaving", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		c := s.acquiring["x"]
		return c != nil && c.leaving == 1
	})
	pcancel() // P, alone now, withdraws the place by name
	if _, err := receive(t, pErr); !errors.Is(err, context.Canceled) {
		t.Fatalf("P: %v, want context.Canceled", err)
	}
	close(gateQ) // Q's request is applied: the session is queued again
	eventually(t, "Q's request applied", state(func() bool { return qApplied }))
	close(takeBackGate)
	if _, err := receive(t, qErr); !errors.Is(err, context.Canceled) || errors.Is(err, ErrWithdrawPending) {
		t.Fatalf("Q: %v, want context.Canceled, settled", err)
	}
	eventually(t, "the settling finished", func() bool { return bookkeepingClear(s) })
	mu.Lock()
	defer mu.Unlock()
	if queued {
		t.Errorf("the session is left queued for x with no call waiting (withdrawals by name: %d)", byName)
	}
}
