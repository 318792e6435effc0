package quorumlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/service"
)

var (
	errExpiredOnCluster = fmt.Errorf("%w: the cluster ended it (it expired or was revoked)", ErrSessionExpired)
	errLeaseRanOut      = fmt.Errorf("%w: no heartbeat acknowledged within the TTL", ErrSessionExpired)
	errSessionClosed    = fmt.Errorf("%w: closed", ErrSessionExpired)
	errAbandoned        = fmt.Errorf("%w: abandoned after an acquire whose outcome could not be settled", ErrSessionExpired)
)

// leaseMargin is the safety margin the client subtracts from the TTL: it
// absorbs clock rate differences between client and leader and a late timer.
// It is TTL/10 (1 s of the default 10 s).
func leaseMargin(ttl time.Duration) time.Duration { return ttl / 10 }

// heartbeatRetry is how soon a failed heartbeat is retried.
func heartbeatRetry(ttl time.Duration) time.Duration { return max(ttl/20, 10*time.Millisecond) }

// Session is a client's liveness lease with the cluster: locks hang off it
// and are released when it ends (closed, or expired because the leader heard
// no heartbeat for its TTL). The Session heartbeats in the background every
// TTL/3. Its methods are safe for concurrent use.
//
// The client believes the session alive until the send time of its last
// acknowledged heartbeat plus TTL minus a safety margin (TTL/10), on its own
// monotonic clock (DESIGN.md invariant 5). The leader expires it no earlier
// than a full TTL after it received that heartbeat, so the client always
// gives up first. Past that point Done and every Lost channel close and
// calls return ErrSessionExpired; an expired session is never renewed.
type Session struct {
	be    backend
	hb    *heartbeater
	clk   clock.Clock
	id    uint64
	ttl   time.Duration
	names int // MaxNameBytes

	done chan struct{}

	mu         sync.Mutex
	seq        uint64
	inflight   map[uint64]struct{}
	calls      map[uint64]context.CancelFunc // seq -> its call's cancel; end cancels them
	acquiring  map[string]*acquireCalls      // acquire calls in flight, by name
	deadline   time.Time
	timer      clock.Timer
	ended      bool
	endErr     error
	closing    bool // Close was called: the cluster's "no such session" means closed
	locks      map[string]*Lock
	leading    map[string]*Leadership // role key -> the Leadership of its current grant (Session.Elect)
	owner      *Leadership            // the Leadership the session was opened for (Node.Elect, Client.Elect)
	nextSend   time.Time
	hbInflight bool
}

// NewSession opens a session through this replica (its requests go to the
// leader: in process when this replica leads, over gRPC otherwise). It blocks
// until the cluster has logged the session or ctx ends. Its attempts (a retry
// after a lost answer, or at a new leader) carry one open ID, so the cluster
// opens one session per call, not one per attempt.
//
// Options: WithTTL (default Config.SessionTTL). Errors: ErrInvalidTTL,
// ErrLimit (too many sessions), ErrClosed, ctx's error.
func (n *Node) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	if n.nilNode() {
		return nil, errNoNode
	}
	ctx = orBackground(ctx)
	o, err := newSessionOptions(n.cfg.SessionTTL, opts)
	if err != nil {
		return nil, err
	}
	if n.isClosed() {
		return nil, ErrClosed
	}
	ctx, cancel := n.bound(ctx)
	defer cancel()
	s, err := openSession(ctx, n.router, n.router.cm.opens, n.hb, n.cfg.Clock, o.ttl, n.cfg.MaxNameBytes)
	if err != nil {
		return nil, n.ctxErr(ctx, err)
	}
	return s, nil
}

// openSession opens a session through be. Every attempt carries one open
// ID (lockpb.Request.open_id), drawn from opens: a retry after a lost or
// late answer gets the session an earlier attempt opened, not a second
// one. The lease counts from before the first attempt, so it ends before
// the leader's expiry of the session, whichever attempt's apply started
// that (invariant 5).
func openSession(ctx context.Context, be backend, opens *openCalls, hb *heartbeater, clk clock.Clock, ttl time.Duration, maxName int) (*Session, error) {
	sent := clk.Now()
	openID := opens.start()
	resp, err := be.propose(ctx, &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: ttl.Milliseconds(), OpenId: openID})
	opens.end(openID, err == nil && resp.GetCode() == lockpb.Code_CODE_OK)
	if err != nil {
		return nil, err
	}
	switch resp.GetCode() {
	case lockpb.Code_CODE_OK:
	case lockpb.Code_CODE_LIMIT:
		return nil, fmt.Errorf("%w: sessions", ErrLimit)
	case lockpb.Code_CODE_INVALID:
		return nil, fmt.Errorf("%w: %v", ErrInvalidTTL, ttl)
	default:
		return nil, fmt.Errorf("quorumlock: open session: %s", resp.GetCode())
	}
	s := &Session{
		be:        be,
		hb:        hb,
		clk:       clk,
		id:        resp.GetSession(),
		ttl:       ttl,
		names:     maxName,
		done:      make(chan struct{}),
		inflight:  make(map[uint64]struct{}),
		calls:     make(map[uint64]context.CancelFunc),
		acquiring: make(map[string]*acquireCalls),
		locks:     make(map[string]*Lock),
		nextSend:  sent.Add(ttl / 3),
	}
	s.mu.Lock()
	s.deadline = sent.Add(ttl - leaseMargin(ttl))
	s.armLocked()
	s.mu.Unlock()
	if !hb.add(s) {
		// Closed while the session was being opened: it ends here, like
		// every session of the closing Node or Client (on the cluster it
		// expires after its TTL).
		s.end(ErrClosed, false)
		return nil, ErrClosed
	}
	return s, nil
}

// ID returns the session's ID: the raft index of the entry that opened it,
// unique in the cluster's lifetime.
func (s *Session) ID() uint64 {
	if s.nilSession() {
		return 0
	}
	return s.id
}

// TTL returns the session's TTL, in whole milliseconds as the cluster keeps
// it (WithTTL); 0 for a nil Session.
func (s *Session) TTL() time.Duration {
	if s.nilSession() {
		return 0
	}
	return s.ttl
}

// Done is closed when the session is over: closed, expired (or revoked) on
// the cluster, its lease ran out on the client, abandoned (an interrupted
// Acquire whose withdrawal the cluster refused, or kept refusing while it
// went on in the background, as it did the release of a grant that won the
// race), or the Node or Client it was opened through closed. The Lost
// channel of every lock the session held is closed before Done is: whoever
// sees Done closed sees them closed too.
func (s *Session) Done() <-chan struct{} {
	if s.nilSession() {
		return closedChan
	}
	s.checkLeaseNow()
	return s.done
}

// Err returns why the session ended (wrapping ErrSessionExpired or
// ErrClosed), or nil while it is alive.
func (s *Session) Err() error {
	if s.nilSession() {
		return errNoSession
	}
	s.checkLeaseNow()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endErr
}

// Deadline returns the end of the client's current belief that the session
// is alive: send time of the last acknowledged heartbeat + TTL - margin.
func (s *Session) Deadline() time.Time {
	if s.nilSession() {
		return time.Time{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// armLocked schedules the lease check at the deadline.
func (s *Session) armLocked() {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.timer = s.clk.AfterFunc(s.deadline.Sub(s.clk.Now()), s.checkLease)
}

func (s *Session) checkLease() {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	if now := s.clk.Now(); now.Before(s.deadline) {
		s.timer = s.clk.AfterFunc(s.deadline.Sub(now), s.checkLease)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.end(errLeaseRanOut, true)
}

// checkLeaseNow ends the session if its lease has run out on the clock
// and the lease timer has not ended it yet: a timer fires late on a busy
// runtime (or in a process that was paused), and until it does, Err, Done
// and Lost would still vouch for a lease that is over (invariant 5: past
// the deadline, every Lost is closed and calls return ErrSessionExpired).
func (s *Session) checkLeaseNow() {
	s.mu.Lock()
	over := !s.ended && !s.clk.Now().Before(s.deadline)
	s.mu.Unlock()
	if over {
		s.end(errLeaseRanOut, true)
	}
}

// renewed records an acknowledged heartbeat sent at sent.
func (s *Session) renewed(sent time.Time) {
	s.mu.Lock()
	s.hbInflight = false
	if s.ended {
		s.mu.Unlock()
		return
	}
	if !s.clk.Now().Before(s.deadline) {
		// The lease ran out before the acknowledgement came and the
		// lease timer has not ended the session yet: an expired session
		// is never renewed (invariant 5), so Deadline never moves from
		// the past back to the future. It ends now, as the timer would.
		s.mu.Unlock()
		s.end(errLeaseRanOut, true)
		return
	}
	if d := sent.Add(s.ttl - leaseMargin(s.ttl)); d.After(s.deadline) {
		// The lease timer re-arms itself lazily when it fires early.
		s.deadline = d
	}
	s.nextSend = sent.Add(s.ttl / 3)
	s.mu.Unlock()
}

func (s *Session) heartbeatFailed(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hbInflight = false
	s.nextSend = now.Add(heartbeatRetry(s.ttl))
}

// end finishes the session locally with cause. With closeRemote, a
// best-effort close is sent so the cluster frees the locks before the TTL
// runs out there too.
func (s *Session) end(cause error, closeRemote bool) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	if cause == errExpiredOnCluster && s.closing {
		// Gone on the cluster while Close was in flight: the entry that
		// closed it answered the session's other calls first, or it was
		// gone already, which Close reports as closed too.
		cause = errSessionClosed
	}
	s.ended, s.endErr = true, cause
	if s.timer != nil {
		s.timer.Stop()
	}
	locks := make([]*Lock, 0, len(s.locks))
	for _, l := range s.locks {
		locks = append(locks, l)
	}
	clear(s.locks)
	calls := make([]context.CancelFunc, 0, len(s.calls))
	for _, cancel := range s.calls {
		calls = append(calls, cancel)
	}
	clear(s.calls)
	leading := s.leadershipsLocked()
	s.mu.Unlock()

	// At once, not through their locks' Lost: a close sent below may elect
	// the next candidates. Before Done closes, as the locks' Lost: whoever
	// sees Done closed sees them closed too (a Lost still open after Done
	// once said "held" in the window between).
	for _, ld := range leading {
		ld.cancel()
	}
	for _, l := range locks {
		l.markLost()
	}
	close(s.done)
	for _, cancel := range calls {
		cancel()
	}
	s.hb.remove(s)
	if closeRemote {
		s.closeRemoteLater()
	}
}

// closeRemoteLater sends the session's close to the cluster in the
// background (best effort, for up to a TTL, until the Node or Client
// closes), so that the cluster frees what it holds, and ends its waits,
// as soon as a leader hears it rather than when its TTL runs out there.
func (s *Session) closeRemoteLater() {
	s.hb.background(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.ttl)
		defer cancel()
		stop := context.AfterFunc(chanCtx(s.hb.closed), cancel)
		defer stop()
		q := s.nextSeq()
		s.be.propose(ctx, q.request(&lockpb.Request{Op: lockpb.Op_OP_CLOSE_SESSION, Session: s.id}))
	})
}

// leadershipsLocked returns the session's leaderships: those of its
// grants of roles (Session.Elect), and the one it was opened for. s.mu is
// held.
func (s *Session) leadershipsLocked() []*Leadership {
	out := make([]*Leadership, 0, len(s.leading)+1)
	for _, ld := range s.leading {
		out = append(out, ld)
	}
	if s.owner != nil {
		out = append(out, s.owner)
	}
	return out
}

// maxListed is how many other requests in flight a request lists at most
// (numbered.pending); a session with more in flight sends only done.
const maxListed = service.MaxListed

// numbered is a request number with what the request tells the cluster
// about the session's other requests: every seq below done has its
// response, and, when listed, so has every seq below seq but pending.
type numbered struct {
	seq, done uint64
	pending   []uint64 // the other requests in flight, increasing
	listed    bool
}

// request sets r's sequence fields from q and returns r.
func (q numbered) request(r *lockpb.Request) *lockpb.Request {
	r.Seq, r.Done, r.Pending, r.Listed = q.seq, q.done, q.pending, q.listed
	return r
}

// nextSeq allocates a request number, with the done mark and the other
// requests in flight to send with it. The number stays in flight until
// finish.
func (s *Session) nextSeq() numbered {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	q := s.numberedLocked(s.seq)
	s.inflight[s.seq] = struct{}{}
	return q
}

// numberedLocked numbers the request seq with the session's other
// requests in flight below it: the lowest is the done mark, and up to
// maxListed of them are listed (past that, none: the cluster then keeps
// every outcome from the done mark on). s.mu is held.
func (s *Session) numberedLocked(seq uint64) numbered {
	q := numbered{seq: seq, done: seq, listed: true}
	for other := range s.inflight {
		if other < seq {
			q.done = min(q.done, other)
			q.pending = append(q.pending, other)
		}
	}
	if len(q.pending) > maxListed {
		q.pending, q.listed = nil, false
	}
	slices.Sort(q.pending)
	return q
}

func (s *Session) finish(seq uint64) {
	s.mu.Lock()
	delete(s.inflight, seq)
	s.mu.Unlock()
}

// call sends req to the leader, re-sending the same (session, seq) across
// leader changes, until an answer, ctx's end, or the session's end.
//
// The session's end cancels the call through s.calls, which end walks: a
// context.AfterFunc on a session context per call cost an allocation and a
// registration under that context's lock for every request.
func (s *Session) call(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
	resp, _, err := s.callUntil(ctx, time.Time{}, req)
	return resp, err
}

// callUntil is call that also stops waiting at stop (zero: never), before
// ctx ends. stopped reports that the call ended because stop passed or ctx
// ended, with the session still live (the outcome of req is then unknown).
// One context serves both the early stop and the session's end.
func (s *Session) callUntil(ctx context.Context, stop time.Time, req *lockpb.Request) (resp *lockpb.Response, stopped bool, err error) {
	var cctx context.Context
	var cancel context.CancelFunc
	if stop.IsZero() {
		cctx, cancel = context.WithCancel(ctx)
	} else {
		cctx, cancel = context.WithDeadline(ctx, stop)
	}
	defer cancel()
	seq := req.GetSeq()
	s.mu.Lock()
	if s.ended {
		cancel()
	} else {
		s.calls[seq] = cancel
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.calls, seq)
		s.mu.Unlock()
	}()
	resp, err = s.be.propose(cctx, req)
	if err != nil {
		if cause := s.Err(); cause != nil {
			return nil, false, cause
		}
		stopped = cctx.Err() != nil
		if ctx.Err() != nil {
			return nil, stopped, ctx.Err()
		}
		return nil, stopped, err
	}
	if resp.GetCode() == lockpb.Code_CODE_NO_SESSION {
		s.end(errExpiredOnCluster, false)
		return nil, false, s.Err()
	}
	return resp, false, nil
}

// Acquire takes the lock name for this session, waiting in FIFO order behind
// the holder and earlier waiters until it is granted or ctx ends. Acquiring
// a lock the session already holds returns the same grant.
//
// When ctx ends while waiting, the outcome is settled before Acquire
// returns, so the caller never has to guess: the request is withdrawn from
// the queue (Acquire returns ctx's error and the session is not queued) or,
// if the grant won the race, the Lock is returned with a nil error. To fit
// the settling into ctx, Acquire stops waiting min(a quarter of the
// election timeout, a tenth of the remaining time) before ctx's deadline
// (settling gets at least 50 ms, which may pass a deadline closer than
// that); after a cancellation (before the deadline, if any) it takes up
// to an election timeout more. If the cluster cannot confirm the withdrawal in
// that time (no leader: an election, a partition, no quorum; or a machine
// so loaded that the round trip to the leader takes longer), Acquire
// returns ctx's error joined with ErrWithdrawPending: the caller does not
// hold the lock, and the session, alive with its other locks, withdraws in
// the background (releasing a grant that won the race) once a leader
// answers. A leaderless window shorter than the TTL so costs a session
// nothing, also when it calls Acquire meanwhile.
//
// Calls of one session for the same name share the session's place in the
// queue: when one stops waiting while another still waits, it leaves the
// place to it (taking back only its own request; if that request was
// granted a free lock meanwhile, the call returns the grant, as when a
// grant wins the race, or, settling in the background, leaves it to the
// calls still waiting or releases it), the last call to end without a
// grant withdraws the place (and returns the grant it finds), and while
// one withdraws the place, a new call waits for the withdrawal before it
// queues. An Acquire answered with a grant that a concurrent Release of
// this session freed returns ErrNotHeld. One answered while such a Release
// is still in flight (sent, not yet answered) may return the Lock that
// Release is freeing: its Lost closes when the Release is answered, so a
// caller that releases a name while another of its calls still waits for
// it must treat the name as given up: once Release is called, the cluster
// may grant the name to another session before Release returns, whichever
// of the session's calls holds the Lock.
//
// Errors: ErrInvalidName, ErrLimit, ErrSessionExpired, ErrClosed, ErrNotHeld,
// ctx's error (joined with ErrWithdrawPending, see above).
func (s *Session) Acquire(ctx context.Context, name string) (*Lock, error) {
	if s.nilSession() {
		return nil, errNoSession
	}
	ctx = orBackground(ctx)
	if err := checkName(name, s.names); err != nil {
		return nil, err
	}
	return s.acquire(ctx, name, false, nil)
}

// TryAcquire takes the lock name if it is free (or already held by this
// session) and returns ErrLocked otherwise; it never queues. Other errors
// as for Acquire.
func (s *Session) TryAcquire(ctx context.Context, name string) (*Lock, error) {
	if s.nilSession() {
		return nil, errNoSession
	}
	ctx = orBackground(ctx)
	if err := checkName(name, s.names); err != nil {
		return nil, err
	}
	return s.acquire(ctx, name, true, nil)
}

// acquireCalls counts a session's acquire calls in flight for one name.
// The cluster keeps one place in the lock's queue per session, which every
// waiting call of the session shares, and answers an acquire of a lock the
// session holds with that grant.
type acquireCalls struct {
	n        int   // calls in flight
	waiting  int   // of them, calls that queue (not try)
	leaving  int   // of those, calls that stopped waiting (they left the place to the others, or withdraw it)
	released Token // the highest token of the name released (or found lost) while calls were in flight
	// unwanted counts the releases of unwanted grants in flight
	// (releaseUnwanted): their released mark must outlive the calls, as a
	// call that starts before such a release applies may be answered with
	// its grant.
	unwanted int
	// settlers counts calls withdrawing the session's place by name now;
	// settled is closed when that drops to 0. A new waiting call waits for
	// it: its acquire, applied before the withdrawal, would lose its place
	// to it, and applied after one, would not be seen by the call that
	// withdraws.
	settlers int
	settled  chan struct{}
	// placeOwed: a call left the session's place to the others (it took
	// back its own request only), so the session may be queued for the
	// name although no call's request is: the answer another waiting call
	// gets may be of its own request, applied while the session held an
	// earlier grant. The last waiting call to end without a grant then
	// withdraws the place (leavePlaceOwed), which clears it; so does a
	// call that withdraws the place when it stops waiting. A recheck that
	// finds the request its call took back queued sets it again
	// (owePlace): that request may have been applied after such a
	// withdrawal, and queued the session anew.
	placeOwed bool
}

// enterAcquire registers an acquire call of name (wait: one that queues).
// A waiting call first waits until no call withdraws the session's place
// in name's queue; it returns ctx's error if ctx ends meanwhile.
func (s *Session) enterAcquire(ctx context.Context, name string, wait bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		c := s.acquiring[name]
		if c == nil {
			c = &acquireCalls{}
			s.acquiring[name] = c
		}
		if !wait || c.settlers == 0 {
			c.n++
			if wait {
				c.waiting++
			}
			return nil
		}
		settled := c.settled
		s.mu.Unlock()
		select {
		case <-settled:
			s.mu.Lock()
		case <-ctx.Done():
			s.mu.Lock()
			return ctx.Err()
		}
	}
}

// settledPlace ends a withdrawal of the session's place in name's queue
// (see leaveQueue).
func (s *Session) settledPlace(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.acquiring[name]
	if c.settlers--; c.settlers == 0 {
		close(c.settled)
		c.settled = nil
		if c.n == 0 && c.unwanted == 0 {
			// A withdrawal that went on in the background after its
			// call returned (settleLater).
			delete(s.acquiring, name)
		}
	}
}

func (s *Session) exitAcquire(name string, wait, left bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.acquiring[name]
	c.n--
	if wait {
		c.waiting--
	}
	if left {
		c.leaving--
	}
	if c.n == 0 && c.settlers == 0 && c.unwanted == 0 {
		delete(s.acquiring, name)
	}
}

// leaveQueue decides for an acquire call of name (a waiting one, or a
// try) that stopped waiting: it leaves the session's place in the queue to
// another call of the session that still waits there (true: it must not
// withdraw the place), or it withdraws the place (false: then it counts as
// a settler until settledPlace, and new waiting calls wait for it). A
// waiting call counts as leaving either way.
func (s *Session) leaveQueue(name string, wait bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.acquiring[name]
	others := c.waiting - c.leaving
	if wait {
		others-- // itself
		c.leaving++
	}
	if others > 0 {
		c.placeOwed = true
		return true
	}
	c.placeOwed = false
	if c.settlers++; c.settlers == 1 {
		c.settled = make(chan struct{})
	}
	return false
}

// leavePlaceOwed is leaveQueue for a waiting call of name that was
// answered without a grant it can return: it counts as leaving, and if a
// call left the place to the others (placeOwed) and no other call still
// waits, it must withdraw the place (true: it then counts as a settler
// until settledPlace), or the session would stay queued with no call to
// take the grant.
func (s *Session) leavePlaceOwed(name string) bool {
	s.mu.Lock()
	s.acquiring[name].leaving++
	s.mu.Unlock()
	return s.claimPlace(name, false)
}

// claimPlace reports whether the caller must withdraw the session's place
// in name's queue, as no call waits there to take it: a call left it to the
// others (placeOwed) and none still waits; or, with orphan, the session's
// place is known to exist and no call of name is in flight at all. Then
// the caller counts as a settler (new waiting calls wait for it) until it
// calls settledPlace.
func (s *Session) claimPlace(name string, orphan bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.acquiring[name]
	switch {
	case c == nil && orphan:
		c = &acquireCalls{}
		s.acquiring[name] = c
	case c == nil, !c.placeOwed && !orphan:
		return false
	case c.waiting-c.leaving > 0:
		// The last of them to end without a grant withdraws it.
		c.placeOwed = c.placeOwed || orphan
		return false
	}
	c.placeOwed = false
	if c.settlers++; c.settlers == 1 {
		c.settled = make(chan struct{})
	}
	return true
}

// owePlace records that the session is queued for name although it may
// be no call's place (placeOwed): a recheck found the request it took back
// queued. The caller is an acquire call of name in flight.
func (s *Session) owePlace(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.acquiring[name]; c != nil {
		c.placeOwed = true
	}
}

// leaveGrantToWaiting reports whether the grant of name that a background
// recheck found (target's outcome: the session holds that grant) is left
// to calls of the session that still wait for name, rather than released.
// The answer cannot tell a grant of target's own (a free lock) from the
// grant of the place target queued in, which the waiting calls are about
// to take; releasing the latter would free the lock under them (found
// under -race: TestConcurrentWaitsShareTheQueuePlace). Either grant
// reaches a waiting call: each is answered with the grant the session
// holds, or ends without one, and then the last of them withdraws the
// place by name (placeOwed, set here), which answers with that grant.
func (s *Session) leaveGrantToWaiting(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.acquiring[name]
	if c == nil || c.waiting-c.leaving == 0 {
		return false
	}
	c.placeOwed = true
	return true
}

// withdrawPlace withdraws the session's place in name's queue for the
// acquire call seq that claimed it (claimPlace), and returns the grant if
// the place was granted meanwhile; handed as for settle.
func (s *Session) withdrawPlace(ctx context.Context, name string, seq uint64) (placed *Lock, handed bool) {
	placed, handed, _ = s.settle(ctx, name, seq, nil)
	if !handed {
		s.settledPlace(name)
	}
	return placed, handed
}

// acquire takes the lock (or role) key, a checked name; value is kept with
// the grant.
func (s *Session) acquire(ctx context.Context, name string, try bool, value []byte) (*Lock, error) {
	if err := s.Err(); err != nil {
		return nil, err
	}
	if err := s.enterAcquire(ctx, name, !try); err != nil {
		return nil, err
	}
	left := false
	defer func() { s.exitAcquire(name, !try, left) }()
	q := s.nextSeq()
	seq := q.seq
	// handed: a settling that goes on in the background owns seq (and
	// the place's withdrawal) from then on.
	handed := false
	defer func() {
		if !handed {
			s.finish(seq)
		}
	}()
	// Stop waiting a little before the caller's deadline, so that settling
	// the outcome fits within it.
	resp, stopped, err := s.callUntil(ctx, s.waitUntil(ctx), q.request(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: s.id, Name: name, Try: try, Value: value}))
	if err != nil {
		if stopped && s.Err() == nil {
			left = !try
			if s.leaveQueue(name, !try) {
				// Another call of this session waits for the lock in the
				// same place; it settles the place when it stops waiting.
				// This request only is taken back, so that a late copy of
				// it (still on its way to the leader) cannot queue the
				// session again after that. If it was applied, it may
				// have been granted a free lock, which the waiting call
				// need not learn of (its answer may be one it got
				// before, of a grant released since): the settling asks
				// for this request's outcome again (recheck).
				recheck := &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: s.id, Name: name, Try: try, Value: value, NoWait: true}
				var l *Lock
				l, handed, err = s.settle(ctx, name, seq, recheck)
				if l == nil && !handed && s.Err() == nil && s.claimPlace(name, false) {
					// The calls it was left to have all ended meanwhile.
					var placed *Lock
					if placed, handed = s.withdrawPlace(ctx, name, seq); placed != nil {
						return placed, nil
					}
				}
				return l, err
			}
			var l *Lock
			l, handed, err = s.settle(ctx, name, seq, nil)
			if !handed {
				s.settledPlace(name)
			}
			return l, err
		}
		return nil, err
	}
	l, err := s.answered(name, resp)
	if err != nil && !try && s.Err() == nil {
		// (A call that returns a grant needs no such care: the session
		// held the lock, so it was not queued; a place queued after a
		// release is seen by the call that left it, see claimPlace.)
		left = true
		if s.leavePlaceOwed(name) {
			var placed *Lock
			if placed, handed = s.withdrawPlace(ctx, name, seq); placed != nil {
				// The place was granted meanwhile: this call's grant.
				return placed, nil
			}
			if end := s.Err(); end != nil {
				return nil, end
			}
		}
	}
	return l, err
}

// answered is the outcome of an acquire of name answered resp.
func (s *Session) answered(name string, resp *lockpb.Response) (*Lock, error) {
	switch resp.GetCode() {
	case lockpb.Code_CODE_OK:
		if resp.GetQueued() {
			// A try of a lock that another call of this session waits
			// for: the session is queued, the lock is another's.
			return nil, fmt.Errorf("%w: %s", ErrLocked, keyLabel(name))
		}
		return s.granted(name, Token(resp.GetToken()))
	case lockpb.Code_CODE_LOCKED:
		return nil, fmt.Errorf("%w: %s", ErrLocked, keyLabel(name))
	case lockpb.Code_CODE_LIMIT:
		return nil, fmt.Errorf("%w: acquiring %s", ErrLimit, keyLabel(name))
	case lockpb.Code_CODE_INVALID:
		return nil, fmt.Errorf("%w: %s (%s)", ErrInvalidName, keyLabel(name), resp.GetMessage())
	default:
		return nil, fmt.Errorf("%w: acquire %s answered %s", ErrNotHeld, keyLabel(name), resp.GetCode())
	}
}

// minSettle is the least time given to settling an acquire, even when the
// caller's deadline leaves less.
const minSettle = 50 * time.Millisecond

// waitUntil is when an acquire stops waiting: when ctx has a deadline,
// settleReserve before it, keeping that time for settle; zero (when ctx
// ends) otherwise.
func (s *Session) waitUntil(ctx context.Context) time.Time {
	d, ok := ctx.Deadline()
	if !ok {
		return time.Time{}
	}
	return d.Add(-settleReserve(s.be.settleGrace(), time.Until(d)))
}

// settleReserve is how long before its deadline an acquire stops waiting
// to settle its outcome: min(grace/4, remaining/10), where grace is the
// backend's settleGrace (an election timeout) and remaining the time left
// until the deadline. A withdrawal takes one commit round when the cluster
// has a leader (about a millisecond), so the reserve is kept small: a
// caller waits nearly its whole deadline (at least 90% of it), as callers
// of etcd's Mutex.Lock or Curator's acquire(time) expect. A withdrawal
// that needs a new leader (a failover in the reserve) does not fit; it
// goes on in the background (ErrWithdrawPending).
func settleReserve(grace, remaining time.Duration) time.Duration {
	return max(0, min(grace/4, remaining/10))
}

// settle withdraws the acquire target of name after its caller stopped
// waiting, and reports the outcome: the grant, if it won the race, or
// ctx's error with the request out of the queue. It has until ctx's deadline (at least
// minSettle), or after a cancellation settleGrace (cut to the time left
// until the deadline, if ctx has one, but not below minSettle unless
// settleGrace is shorter). If the withdrawal is not
// answered in that time (no leader yet: an election, a partition), the
// caller gets ctx's error all the same, and the withdrawal goes on in the
// background (handed reports it: it then owns target's number and, without
// recheck, the withdrawal of the place, see settleLater): the session keeps
// its other locks, which a leaderless window shorter than the TTL must not
// cost it. With recheck (target's acquire again, with NoWait) only the
// request is taken back (if not applied yet, it never will be), and the
// session keeps its place in the queue; since such a withdrawal does not
// say whether target was applied and granted, recheck then asks for
// target's outcome (the cluster answers a copy of an applied request with
// its outcome, a grant the session still holds included). A withdrawal
// the cluster refuses (a limit) abandons the session: whether it is still
// queued is unknown.
func (s *Session) settle(ctx context.Context, name string, target uint64, recheck *lockpb.Request) (l *Lock, handed bool, err error) {
	budget := s.be.settleGrace()
	if d, ok := ctx.Deadline(); ok {
		if errors.Is(ctx.Err(), context.Canceled) {
			// Cancelled before its deadline: the caller wants out now,
			// not when a deadline (maybe hours away) passes.
			budget = min(budget, max(time.Until(d), minSettle))
		} else {
			budget = max(time.Until(d), minSettle)
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
	defer cancel()
	cause := waitCause(ctx)
	q := s.nextSeq()
	wname := name
	if recheck != nil {
		wname = "" // take back target only
	}
	req := q.request(&lockpb.Request{Op: lockpb.Op_OP_WITHDRAW, Session: s.id, Name: wname, Target: target})
	resp, err := s.call(sctx, req)
	if err == nil && recheck != nil && resp.GetCode() == lockpb.Code_CODE_WITHDRAWN {
		resp, err = s.call(sctx, s.renumbered(target, recheck))
		if err == nil && (resp.GetCode() != lockpb.Code_CODE_OK || resp.GetQueued()) {
			// Not granted (taken back before it was applied, refused,
			// or queued: then the place is the waiting calls').
			if resp.GetQueued() {
				// The session is queued: if the calls it was left to
				// have all ended (one withdrew the place before target
				// was applied and queued it again), nobody's. It is
				// owed: the last call of the name to end without a
				// grant withdraws it (the caller, if that is it).
				s.owePlace(name)
			}
			resp = &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}
		}
	}
	if err != nil {
		if end := s.Err(); end != nil {
			s.finish(q.seq)
			return nil, false, errors.Join(cause, end)
		}
		if s.settleLater(name, target, q.seq, req, recheck) {
			return nil, true, errors.Join(cause, ErrWithdrawPending)
		}
		// The Node or Client is closing: its sessions end with it, and
		// the cluster frees what this one was granted.
		s.finish(q.seq)
		s.end(ErrClosed, false)
		return nil, false, errors.Join(cause, s.Err())
	}
	s.finish(q.seq)
	switch resp.GetCode() {
	case lockpb.Code_CODE_OK:
		l, err := s.granted(name, Token(resp.GetToken()))
		return l, false, err
	case lockpb.Code_CODE_WITHDRAWN:
		return nil, false, cause
	}
	// Refused (a limit): whether the session is still queued is unknown,
	// so it cannot be trusted to hold what it believes; ending it frees
	// whatever the cluster grants it.
	s.end(errAbandoned, true)
	return nil, false, fmt.Errorf("%w (the withdrawal was answered %s)", errors.Join(cause, errAbandoned), resp.GetCode())
}

// settleLater re-sends the withdrawal req (seq wseq) of the acquire
// target of name in the background until the cluster answers it or the
// session ends, then, with recheck (req takes back target only), asks for
// target's outcome as settle does: the caller has been told it did not get
// the lock, so a grant that won the race is released (by its token) rather
// than returned, unless other calls of the session still wait for name
// (then it is theirs, see leaveGrantToWaiting). Until then target and
// wseq stay in flight, and a withdrawal of the place (without recheck)
// keeps new waiting calls of the name waiting (settledPlace), as it does
// while the caller settles. It reports false if the Node or Client is
// closing (nothing started).
//
// A refusal for the session's number of requests in flight (a limit) is
// not final here, as it is for a caller who must be told the outcome now:
// it changed nothing, and the withdrawal is sent again a little later,
// listing the session's requests in flight then (for up to limitPatience
// election timeouts or half the TTL, see refusals.again; then the session
// is abandoned, as for a refusal of any other kind). Many calls interrupted in
// one leaderless window leave as many withdrawals, each with its target
// (two requests in flight), all sent again at once when a leader is back
// with the lists of the moment they were first sent: past the cluster's
// 1,024 requests per session the last of them were refused, and abandoning
// the session then cost it every lock, which the background withdrawal
// is there to spare it.
func (s *Session) settleLater(name string, target, wseq uint64, req, recheck *lockpb.Request) bool {
	return s.hb.background(func() {
		defer s.finish(target)
		defer s.finish(wseq)
		if recheck == nil {
			defer s.settledPlace(name)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		defer context.AfterFunc(chanCtx(s.hb.closed), cancel)()
		var refused refusals
		for {
			resp, err := s.call(ctx, req)
			if err != nil {
				return // the session ended: the cluster frees what it held
			}
			if recheck != nil && resp.GetCode() == lockpb.Code_CODE_WITHDRAWN {
				// Taken back; was target applied and granted?
				if resp, err = s.call(ctx, s.renumbered(target, recheck)); err != nil {
					return
				}
				switch {
				case resp.GetCode() == lockpb.Code_CODE_OK && !resp.GetQueued():
					if !s.leaveGrantToWaiting(name) {
						s.releaseUnwanted(ctx, name, Token(resp.GetToken()))
					}
				case resp.GetQueued() && s.claimPlace(name, true):
					// The place target queued is the session's, and the
					// calls it was left to have all ended: withdraw it.
					q := s.nextSeq()
					w := q.request(&lockpb.Request{Op: lockpb.Op_OP_WITHDRAW, Session: s.id, Name: name})
					if !s.settleLater(name, 0, q.seq, w, nil) {
						s.finish(q.seq)
						s.settledPlace(name)
					}
				}
				return
			}
			switch resp.GetCode() {
			case lockpb.Code_CODE_WITHDRAWN:
				return
			case lockpb.Code_CODE_OK:
				s.releaseUnwanted(ctx, name, Token(resp.GetToken()))
				return
			case lockpb.Code_CODE_LIMIT:
				if retry, ok := refused.again(s); ok {
					if !s.pause(ctx, retry) {
						return
					}
					req = s.renumbered(wseq, &lockpb.Request{Op: lockpb.Op_OP_WITHDRAW, Session: s.id, Name: req.GetName(), Target: target})
					continue
				}
			}
			// Refused for good, or for too long: whether the session is
			// still queued is unknown.
			s.end(errAbandoned, true)
			return
		}
	})
}

// limitPatience is how long, in election timeouts, a background
// withdrawal (or its release) goes on after refusals for the session's
// requests in flight before the session is abandoned: those of a burst of
// withdrawals sent when a leader is back clear in a few commit rounds; a
// refusal that lasts means the session keeps more than 1,024 requests in
// flight, and a place in a queue that nobody waits for would then last
// as long.
const limitPatience = 10

// refusals tracks the refusals (a limit) of one background request.
type refusals struct {
	since   time.Time
	backoff time.Duration
}

// again records a refusal and returns how long to wait before sending the
// request again, or false once the refusals have lasted limitPatience
// election timeouts or half the session's TTL, whichever is longer (with
// short election timeouts on a loaded machine, a burst of hundreds of
// withdrawals took longer than ten of them to drain: found under -race).
func (r *refusals) again(s *Session) (time.Duration, bool) {
	grace := s.be.settleGrace()
	if r.since.IsZero() {
		r.since, r.backoff = time.Now(), minBackoff
	} else {
		r.backoff = min(2*r.backoff, grace)
	}
	return r.backoff, time.Since(r.since) < max(limitPatience*grace, s.ttl/2)
}

// renumbered sets r's sequence fields for the request seq, in flight,
// from the session's other requests in flight now (as nextSeq does for a
// new one): a copy of a refused request sent again must not list those
// answered since, whose outcomes the cluster would go on keeping.
func (s *Session) renumbered(seq uint64, r *lockpb.Request) *lockpb.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.numberedLocked(seq).request(r)
}

// pause waits d, and reports false if ctx or the session ended meanwhile.
func (s *Session) pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-s.done:
		return false
	}
}

// releaseUnwanted releases the grant t of name that a settling found after
// its caller had been told it did not get the lock, unless another call of
// the session holds that grant now (acquiring a held lock returns it).
// From here on, an answer with grant t is refused as one freed by a
// concurrent Release (granted). A release refused for the session's
// requests in flight (a limit) changed nothing: it is sent again a little
// later, as settleLater does (for up to limitPatience election timeouts
// or half the TTL, then the session is abandoned).
func (s *Session) releaseUnwanted(ctx context.Context, name string, t Token) {
	s.mu.Lock()
	if l := s.locks[name]; l != nil && l.token == t {
		s.mu.Unlock()
		return
	}
	// Kept even with no call of name in flight now: one that starts
	// before the release applies may be answered with t.
	c := s.acquiring[name]
	if c == nil {
		c = &acquireCalls{}
		s.acquiring[name] = c
	}
	c.released = max(c.released, t)
	c.unwanted++ // the calls that exit meanwhile leave the mark
	s.mu.Unlock()
	defer func() {
		// Once the release is applied (or the session ended), a call that
		// starts now cannot be answered with t: the mark is needed no
		// longer than the calls in flight now.
		s.mu.Lock()
		if c.unwanted--; c.n == 0 && c.settlers == 0 && c.unwanted == 0 {
			delete(s.acquiring, name)
		}
		s.mu.Unlock()
	}()
	var refused refusals
	for {
		q := s.nextSeq()
		resp, err := s.call(ctx, q.request(&lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: s.id, Name: name, Token: uint64(t)}))
		s.finish(q.seq)
		if err != nil || resp.GetCode() != lockpb.Code_CODE_LIMIT {
			return
		}
		retry, ok := refused.again(s)
		if !ok {
			// Refused for too long: the session would hold a lock
			// nobody knows of.
			s.end(errAbandoned, true)
			return
		}
		if !s.pause(ctx, retry) {
			return
		}
	}
}

// waitCause is the error of an acquire that stopped waiting under ctx:
// ctx's, or DeadlineExceeded when it stopped early to leave time for
// settling (see waitUntil).
func waitCause(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// granted returns the Lock for a grant of name with token t. A grant that
// a Release of this session freed while the acquire was answered (the
// acquire found the lock held by the session and was applied before the
// release) is not returned: ErrNotHeld.
func (s *Session) granted(name string, t Token) (*Lock, error) {
	s.mu.Lock()
	if !s.ended && !s.clk.Now().Before(s.deadline) {
		// Answered after the lease ran out, before the lease timer
		// fired: the grant is not the client's to use (checkLeaseNow).
		s.mu.Unlock()
		s.end(errLeaseRanOut, true)
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	if s.ended {
		return nil, s.endErr
	}
	if c := s.acquiring[name]; c != nil && t <= c.released {
		return nil, fmt.Errorf("%w: %s: the grant (token %d) was freed by a concurrent Release", ErrNotHeld, keyLabel(name), t)
	}
	if l, ok := s.locks[name]; ok {
		if l.token == t {
			return l, nil
		}
		if t < l.token {
			// A late answer (a delayed or retried acquire) with a grant
			// older than the one the session holds: tokens of a name
			// only grow, and a session holds one grant of a name at a
			// time, so t is gone. l is not touched: it may be current.
			return nil, fmt.Errorf("%w: %s: the grant (token %d) was replaced by token %d", ErrNotHeld, keyLabel(name), t, l.token)
		}
		// A session holds one grant of a name at a time: the grant l
		// stood for is gone (released by a call whose answer was lost).
		// Its Lost closes now; dropped from s.locks, end would miss it.
		l.markLostLocked()
	}
	l := &Lock{s: s, name: name, token: t}
	s.locks[name] = l
	return l, nil
}

// dropLock forgets l, whose grant is no longer held (released, or found
// not current); acquires of its name in flight must not return it (see
// granted).
func (s *Session) dropLock(l *Lock) {
	s.mu.Lock()
	if s.locks[l.name] == l {
		delete(s.locks, l.name)
	}
	if c := s.acquiring[l.name]; c != nil {
		c.released = max(c.released, l.token)
	}
	s.mu.Unlock()
}

// Locks returns the locks this session holds, sorted by name. A role the
// session leads (Elect) is not among them: its lock lives in a namespace of
// its own and is given up through Leadership.Resign, which ends Done first.
func (s *Session) Locks() []*Lock {
	if s.nilSession() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Lock, 0, len(s.locks))
	for _, l := range s.locks {
		if !strings.HasPrefix(l.name, fsm.RolePrefix) {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b *Lock) int { return strings.Compare(a.name, b.name) })
	return out
}

// Close releases every lock of the session and ends it on the cluster; the
// next waiters are granted. Done and every Lost channel close whatever the
// outcome, and the session's leaderships end (their Done closes) before
// the close is sent, as with Resign. Closing an ended session returns nil
// if it was closed, the end cause otherwise. If ctx ends first the error
// wraps ErrUnknownOutcome: the session stops heartbeating, and the close
// goes on in the background (for up to a TTL, until the Node or Client
// closes), so its locks are freed when a leader hears it, at the latest
// when its TTL runs out on the leader.
func (s *Session) Close(ctx context.Context) error {
	if s.nilSession() {
		return errNoSession
	}
	ctx = orBackground(ctx)
	if err := s.Err(); err != nil {
		if errors.Is(err, errSessionClosed) {
			return nil
		}
		return err
	}
	s.mu.Lock()
	s.closing = true
	leading := s.leadershipsLocked()
	s.mu.Unlock()
	// As Resign does: the leaderships end before the close can elect the
	// next candidates, whose work must not overlap theirs.
	for _, ld := range leading {
		ld.cancel()
	}
	q := s.nextSeq()
	defer s.finish(q.seq)
	resp, err := s.call(ctx, q.request(&lockpb.Request{Op: lockpb.Op_OP_CLOSE_SESSION, Session: s.id}))
	s.end(errSessionClosed, false)
	switch {
	case errors.Is(err, errSessionClosed), errors.Is(err, errExpiredOnCluster):
		// Gone on the cluster: closed by this request or a concurrent
		// Close, whose answer reached another call of the session first,
		// by an earlier copy of this request that was answered to a
		// leader we lost, or expired (found just before Close began).
		// Either way nothing is held.
		return nil
	case err != nil && errors.Is(err, ErrSessionExpired):
		return err
	case err != nil && ctx.Err() != nil:
		// No leader answered in time (or ctx was already over): keep
		// closing in the background, so that the cluster frees the
		// session's locks and ends its waits as soon as a leader hears,
		// not when the TTL runs out there.
		s.closeRemoteLater()
		return fmt.Errorf("%w: closing session %d: %w", ErrUnknownOutcome, s.id, err)
	case err != nil:
		return err
	case resp.GetCode() != lockpb.Code_CODE_OK:
		return fmt.Errorf("quorumlock: closing session %d: %s", s.id, resp.GetCode())
	}
	return nil
}

func checkName(name string, max int) error {
	if !fsm.ValidName(name, max) {
		return fmt.Errorf("%w: %s, %d bytes (want 1..%d bytes of UTF-8 without NUL)", ErrInvalidName, keyLabel(name), len(name), max)
	}
	return nil
}

// checkRole is checkName for an election's role: the same rule, with the
// role named as one in the error.
func checkRole(role string, max int) error {
	if !fsm.ValidName(role, max) {
		return fmt.Errorf("%w: role %s, %d bytes (want 1..%d bytes of UTF-8 without NUL)", ErrInvalidName, quoteShort(role), len(role), max)
	}
	return nil
}

// keyLabel names a lock-table key in an error message: a lock by its
// quoted name, a role (whose key carries an internal prefix) as
// role "name".
func keyLabel(key string) string {
	if role, ok := strings.CutPrefix(key, fsm.RolePrefix); ok {
		return "role " + quoteShort(role)
	}
	return quoteShort(key)
}

// quoteShort quotes s, cut to its first 64 bytes (and "...") when longer,
// so that an error about a huge name stays readable.
func quoteShort(s string) string {
	const keep = 64
	if len(s) <= keep {
		return strconv.Quote(s)
	}
	return strconv.Quote(s[:keep]) + "..."
}
