package quorumlock

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// Leader election is a lock named for the role, in a namespace of its own
// (a role never collides with a lock of the same name), whose fencing token
// is the leader's epoch (DESIGN.md; etcd's concurrency.Election and
// Curator's LeaderLatch work the same way). Candidates queue in FIFO order
// and only the first is woken when the leader goes: no thundering herd.

// LeaderInfo describes a role's leadership as of a read or an Observe event.
type LeaderInfo struct {
	Role string
	// Session is the leader's session ID; 0 when the role has no leader.
	Session uint64
	// Epoch is the leader's fencing token. In an Observe event without a
	// leader it is the epoch of the last leader that stream reported (0 if
	// none), so epochs in a stream never decrease.
	Epoch Token
	// Value is what the leader published with Elect or Proclaim. Every
	// read and every Observe event has its own copy.
	Value []byte
}

// HasLeader reports whether the role had a leader.
func (i LeaderInfo) HasLeader() bool { return i.Session != 0 }

// MaxValueBytes bounds the value of a leadership (Elect, Proclaim).
const MaxValueBytes = 4096

func roleKey(role string) string { return fsm.RolePrefix + role }

func checkValue(v []byte) error {
	if len(v) > MaxValueBytes {
		return fmt.Errorf("%w: value of %d bytes (at most %d)", ErrLimit, len(v), MaxValueBytes)
	}
	return nil
}

// Leadership is a session's term as leader of a role. Its methods are safe
// for concurrent use.
type Leadership struct {
	role  string
	s     *Session
	lock  *Lock
	owned bool // the session was opened for this leadership (Node.Elect, Client.Elect)

	resigned atomic.Bool // Resign was called while the session was live

	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
}

// Elect campaigns for role with value and blocks until this session leads
// it (FIFO among candidates) or ctx ends. If ctx ends first, the candidacy
// is withdrawn as Acquire's is, so a candidate that left never becomes
// leader. A session that already leads the role gets its current
// leadership (the same *Leadership, with its value unchanged), unless
// that one's Done has closed (an unconfirmed Resign): then a new one.
// Once Close has begun, a leadership granted meanwhile is returned with
// its Done closed: Close may have elected the next candidate.
//
// Errors: ErrInvalidName (role: 1..MaxNameBytes bytes of UTF-8 without NUL),
// ErrLimit (value over MaxValueBytes, or a table limit), ErrNotHeld (the
// session led the role, and a concurrent Resign or Release gave that
// grant up while Elect was answered with it), ErrSessionExpired,
// ErrClosed, ctx's error (joined with ErrWithdrawPending when no leader
// confirmed the withdrawal in time: it goes on in the background, as
// Acquire's does).
func (s *Session) Elect(ctx context.Context, role string, value []byte) (*Leadership, error) {
	if s.nilSession() {
		return nil, errNoSession
	}
	ctx = orBackground(ctx)
	if err := checkRole(role, s.names); err != nil {
		return nil, err
	}
	if err := checkValue(value); err != nil {
		return nil, err
	}
	l, err := s.acquire(ctx, roleKey(role), false, value)
	if err != nil {
		return nil, err
	}
	// One Leadership per grant: a second handle whose Done stayed open
	// after the first resigned would outlive the leadership.
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		// The session ended since the grant was answered: its error, as
		// when it ends a moment earlier (found by review M).
		return nil, s.endErr
	}
	if l.gone || s.locks[l.name] != l {
		// Released (or lost) since it was answered.
		return nil, fmt.Errorf("%w: role %q: the grant (epoch %d) was given up meanwhile", ErrNotHeld, role, l.token)
	}
	if ld := s.leading[l.name]; ld != nil && ld.lock == l && ld.ctx.Err() == nil {
		return ld, nil
	}
	if ld := s.owner; ld != nil && ld.lock == l && ld.ctx.Err() == nil {
		// The session was opened for this leadership (Node.Elect,
		// Client.Elect): that handle is the grant's.
		return ld, nil
	}
	if l.resigning.Load() > 0 {
		// A concurrent Resign (of this grant's handle, or of an older
		// handle of it) is giving the grant up: the handles' Done closed
		// before the release was sent, and a new handle's would close
		// only when the release is answered, after the next candidate
		// may have been elected.
		return nil, fmt.Errorf("%w: role %q: a concurrent Resign is giving up the grant (epoch %d)", ErrNotHeld, role, l.token)
	}
	ld := newLeadership(role, s, l, false)
	if s.leading == nil {
		s.leading = make(map[string]*Leadership)
	}
	s.leading[l.name] = ld
	if s.closing {
		// Granted before a Close that has ended the session's
		// leaderships already and whose close may have elected the next
		// candidate: this one is over too.
		ld.cancel()
	}
	return ld, nil
}

func newLeadership(role string, s *Session, l *Lock, owned bool) *Leadership {
	ld := &Leadership{role: role, s: s, lock: l, owned: owned}
	ld.ctx, ld.cancel = context.WithCancel(context.Background())
	go func() {
		<-l.Lost()
		ld.end()
	}()
	return ld
}

// Elect opens a session on this replica dedicated to the leadership and
// campaigns with it (see Session.Elect). The session is closed when the
// leadership is resigned, and ends with it when it is lost. If the
// campaign fails, the session is closed before Elect returns; if no
// leader answers that close in time (ErrWithdrawPending, say), the close
// goes on in the background, so the candidacy leaves the queue as soon as
// a leader hears it.
func (n *Node) Elect(ctx context.Context, role string, value []byte) (*Leadership, error) {
	if n.nilNode() {
		return nil, errNoNode
	}
	return electOwned(orBackground(ctx), role, value, n.cfg.MaxNameBytes, n.cfg.electionTimeout(), n.NewSession)
}

// Elect is Node.Elect through the client: it opens a session on the cluster
// dedicated to the leadership (with the client's default TTL) and campaigns
// with it (see Session.Elect). The session is closed when the leadership is
// resigned, and ends with it when it is lost. If the campaign fails, the
// session is closed as Node.Elect's is (in the background if no leader
// answers that close within the WithElectionTimeout).
func (c *Client) Elect(ctx context.Context, role string, value []byte) (*Leadership, error) {
	if c.nilClient() {
		return nil, errNoClient
	}
	return electOwned(orBackground(ctx), role, value, c.opts.maxName, c.opts.settle, c.NewSession)
}

// electOwned campaigns for role with a session opened for it; settle bounds
// the closing of that session when the campaign fails.
func electOwned(ctx context.Context, role string, value []byte, maxName int, settle time.Duration,
	newSession func(context.Context, ...SessionOption) (*Session, error)) (*Leadership, error) {
	if err := checkRole(role, maxName); err != nil {
		return nil, err
	}
	if err := checkValue(value); err != nil {
		return nil, err
	}
	s, err := newSession(ctx)
	if err != nil {
		return nil, err
	}
	l, err := s.acquire(ctx, roleKey(role), false, value)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settle)
		defer cancel()
		// If no leader answers the close in time (typically with
		// ErrWithdrawPending: no leader answered the withdrawal either),
		// Close ends the session here, and with it its background
		// withdrawal, and goes on closing it in the background: else the
		// cluster would keep the candidacy, and could elect it with
		// nobody leading, until the session's TTL ran out there.
		s.Close(cctx)
		return nil, err
	}
	ld := newLeadership(role, s, l, true)
	s.mu.Lock()
	s.owner = ld
	s.mu.Unlock()
	return ld, nil
}

// end finishes the leadership locally: Done closes and Context is cancelled.
// An owned session has no other use, so it is closed (best effort) to free
// the role at once.
func (l *Leadership) end() {
	l.once.Do(func() {
		l.cancel()
		l.s.mu.Lock()
		if key := roleKey(l.role); l.s.leading[key] == l {
			delete(l.s.leading, key)
		}
		l.s.mu.Unlock()
		if l.owned && l.s.Err() == nil {
			l.s.hb.background(func() {
				ctx, cancel := context.WithTimeout(context.Background(), l.s.ttl)
				defer cancel()
				stop := context.AfterFunc(chanCtx(l.s.hb.closed), cancel)
				defer stop()
				l.s.Close(ctx)
			})
		}
	})
}

// Role returns the role led.
func (l *Leadership) Role() string {
	if l == nil {
		return ""
	}
	return l.role
}

// Epoch returns the leadership's epoch: the fencing token of the role's
// grant. It strictly increases with every new leader of the role; hand it
// to downstream systems so they can reject an old leader (Fence).
func (l *Leadership) Epoch() Token {
	if l == nil {
		return 0
	}
	return l.lock.Token()
}

// Session returns the session that leads.
func (l *Leadership) Session() *Session {
	if l == nil {
		return nil
	}
	return l.s
}

// Done is closed when the leadership is over: resigned, or lost with its
// session (closed, expired, lease run out, replica stopped, revoked). It
// closes before any other candidate can be elected (the client's lease ends
// before the leader expires the session), with one exception: a session
// revoked by an operator (Client.RevokeSession) ends at once on the
// cluster, and the next candidate may be elected before this process hears
// of it (at its next heartbeat, at most a third of the TTL later). The
// epoch fences that gap: a resource that checks it refuses the old
// leader's writes.
func (l *Leadership) Done() <-chan struct{} {
	if l.nilLeadership() {
		return closedChan
	}
	l.s.checkLeaseNow()
	return l.ctx.Done()
}

// Context returns a context cancelled when Done closes: run the leader's
// work under it.
func (l *Leadership) Context() context.Context {
	if l.nilLeadership() {
		return endedCtx
	}
	l.s.checkLeaseNow()
	return l.ctx
}

// Resign gives up the leadership: the next candidate is elected with a
// larger epoch. With Node.Elect or Client.Elect, the dedicated session is
// closed too. Done closes at once, before the release is sent (so before
// the next candidate can be elected), whatever the outcome, and so does
// that of the handle a later Elect returned for the same grant (after a
// Resign whose release went unconfirmed). Errors as for
// Lock.Release (ErrNotHeld if the leadership was already resigned; once
// its session has ended, which is how a leadership is lost, the
// session's error: ErrSessionExpired or ErrClosed), except with
// Node.Elect or Client.Elect, where Resign is Session.Close of the
// dedicated session: a second Resign returns nil, and one after the
// session ended returns its end cause.
func (l *Leadership) Resign(ctx context.Context) error {
	if l.nilLeadership() {
		return errNoGrant
	}
	ctx = orBackground(ctx)
	// Done closes before the release can elect the next candidate: the
	// leader's work (under Context) must have been told to stop first.
	if l.s.Err() == nil {
		// Resigned from a live session: Proclaim then reports the
		// leadership's end, even once Node.Elect's session is closed.
		l.resigned.Store(true)
	}
	// Counted before Done closes: Session.Elect tells a Resign in
	// flight (ErrNotHeld) from one whose release went unconfirmed.
	l.lock.resigning.Add(1)
	defer l.lock.resigning.Add(-1)
	l.cancel()
	defer l.end()
	// Another handle of the same grant (Elect after a Resign of l whose
	// release went unconfirmed) is given up too: its Done closes now,
	// not when the release is answered (it ends when Lost closes).
	l.s.mu.Lock()
	for _, o := range []*Leadership{l.s.leading[roleKey(l.role)], l.s.owner} {
		if o != nil && o != l && o.lock == l.lock {
			o.cancel()
		}
	}
	l.s.mu.Unlock()
	if l.owned {
		return l.s.Close(ctx)
	}
	return l.lock.Release(ctx)
}

// Proclaim replaces the value published with the leadership, without
// giving it up. A deposed leader's Proclaim fails with ErrNotHeld (the
// epoch is no longer current) and changes nothing, and so does one called
// after Resign (even one whose release is unconfirmed, and with Node.Elect
// or Client.Elect, whose session Resign closed) or once Done has closed
// while the session lives. Once the session has ended (closed, expired,
// revoked, its Node or Client closed), Proclaim returns the session's
// error: ErrSessionExpired or ErrClosed. Other errors: ErrLimit for a value
// over MaxValueBytes (4 KiB), ErrUnknownOutcome wrapping ctx's error if ctx
// ended before the answer, or wrapping ErrLimit if the cluster refused it
// because the session has too many requests pending (calling Proclaim
// again settles it).
func (l *Leadership) Proclaim(ctx context.Context, value []byte) error {
	if l.nilLeadership() {
		return errNoGrant
	}
	ctx = orBackground(ctx)
	s := l.s
	if err := checkValue(value); err != nil {
		return err
	}
	if l.resigned.Load() {
		// Before the session's state: Node.Elect's Resign closes the
		// session too, and the caller ended the leadership, not it.
		return fmt.Errorf("%w: leadership of %q resigned", ErrNotHeld, l.role)
	}
	if err := s.Err(); err != nil {
		return err
	}
	// Done closes first on Resign (before the release is confirmed) and
	// after Lost otherwise: once either closed, the leadership is over for
	// its holder, whatever the cluster still lists.
	if isDone(l.ctx.Done()) || isDone(l.lock.Lost()) {
		if err := s.Err(); err != nil {
			// The session ended in between: that is why (Session.end sets
			// its error before it ends the leadership and closes Lost).
			return err
		}
		return fmt.Errorf("%w: leadership of %q ended", ErrNotHeld, l.role)
	}
	q := s.nextSeq()
	defer s.finish(q.seq)
	resp, err := s.call(ctx, q.request(&lockpb.Request{Op: lockpb.Op_OP_PROCLAIM, Session: s.id,
		Name: roleKey(l.role), Token: uint64(l.Epoch()), Value: value}))
	if err != nil {
		if ctx.Err() != nil && s.Err() == nil {
			return fmt.Errorf("%w: proclaiming %q: %w", ErrUnknownOutcome, l.role, err)
		}
		return err
	}
	switch resp.GetCode() {
	case lockpb.Code_CODE_OK:
		return nil
	case lockpb.Code_CODE_NOT_HELD:
		return fmt.Errorf("%w: not the leader of %q at epoch %d", ErrNotHeld, l.role, l.Epoch())
	case lockpb.Code_CODE_INVALID:
		return fmt.Errorf("%w: value of %d bytes", ErrLimit, len(value))
	case lockpb.Code_CODE_LIMIT:
		// Refused, as Release is: another copy of the request (re-sent
		// after a leader change) may still be applied.
		return fmt.Errorf("%w: %w: proclaiming %q: too many requests of this session pending", ErrUnknownOutcome, ErrLimit, l.role)
	default:
		return fmt.Errorf("quorumlock: proclaim %q: %s", l.role, resp.GetCode())
	}
}

// Leader returns the current leader of role as of a linearizable read.
// Errors: ErrNoLeader, ErrInvalidName (also for a role longer than
// MaxNameBytes that nobody holds, as Holder), ErrClosed, ctx's error.
func (n *Node) Leader(ctx context.Context, role string) (LeaderInfo, error) {
	if n.nilNode() {
		return LeaderInfo{}, errNoNode
	}
	ctx = orBackground(ctx)
	if err := checkRole(role, MaxNameBytesLimit); err != nil { // longer than MaxNameBytes: answered while held (Config.MaxNameBytes)
		return LeaderInfo{}, err
	}
	if n.isClosed() {
		return LeaderInfo{}, ErrClosed
	}
	ctx, cancel := n.bound(ctx)
	defer cancel()
	resp, err := n.svc.Holder(ctx, &lockpb.HolderRequest{Name: roleKey(role)})
	if err != nil {
		return LeaderInfo{}, n.ctxErr(ctx, err)
	}
	if resp.GetCode() == lockpb.Code_CODE_INVALID {
		return LeaderInfo{}, fmt.Errorf("%w: role %s (%s)", ErrInvalidName, quoteShort(role), resp.GetMessage())
	}
	if resp.GetSession() == 0 {
		return LeaderInfo{Role: role}, fmt.Errorf("%w for %q", ErrNoLeader, role)
	}
	return LeaderInfo{Role: role, Session: resp.GetSession(), Epoch: Token(resp.GetToken()), Value: resp.GetValue()}, nil
}

// Observe streams the leadership of role as this replica applies it: first
// the current state (after a linearizable read), then every change in log
// order. Between two leaders it always reports an event without a leader,
// and epochs never decrease. A receiver that falls behind gets at least
// the latest 1,024 changes it has not read; one further behind may lose
// the oldest, never the latest state (a leadership that began and ended
// meanwhile is then missed). It keeps working across
// leader changes of the cluster and outages of this replica's link to the
// majority (events resume when the replica catches up). The channel closes
// when ctx ends or the Node closes, and at once for an invalid role or a
// closed Node.
func (n *Node) Observe(ctx context.Context, role string) <-chan LeaderInfo {
	ctx = orBackground(ctx)
	out := make(chan LeaderInfo)
	if n.nilNode() || checkRole(role, MaxNameBytesLimit) != nil || n.isClosed() {
		close(out)
		return out
	}
	ctx, cancel := n.bound(ctx)
	go func() {
		defer cancel()
		defer close(out)
		// A role over MaxNameBytes is observed only while held (see
		// MaxNameBytesLimit).
		if ok, err := n.svc.Readable(ctx, roleKey(role)); !ok || err != nil {
			return
		}
		observe(ctx, role, n.svc.Watch(ctx, roleKey(role)), out)
	}()
	return out
}

// observe turns lock states into leadership events: a change of leader is
// reported as "no leader" then the new leader.
func observe(ctx context.Context, role string, src <-chan fsm.LockInfo, out chan<- LeaderInfo) {
	var last LeaderInfo
	first := true
	send := func(ev LeaderInfo) bool {
		// The receiver owns what it gets: the source's Value is shared
		// with the other watchers of the role and kept in last.
		sent := ev
		sent.Value = slices.Clone(ev.Value)
		select {
		case out <- sent:
			last, first = ev, false
			return true
		case <-ctx.Done():
			return false
		}
	}
	for li := range src {
		ev := LeaderInfo{Role: role, Session: li.Holder, Epoch: Token(li.Token), Value: li.Value}
		if !first && ev.Session == last.Session && (ev.Session == 0 || ev.Epoch == last.Epoch) && string(ev.Value) == string(last.Value) {
			continue // a repeat (a resumed stream starts with the current state)
		}
		if ev.HasLeader() && ev.Epoch < last.Epoch {
			continue // older than what was reported: never go back
		}
		if ev.Session == 0 {
			ev.Epoch = last.Epoch
			if !first && !last.HasLeader() {
				continue
			}
		} else if last.HasLeader() && last.Epoch != ev.Epoch {
			if !send(LeaderInfo{Role: role, Epoch: last.Epoch}) {
				return
			}
		}
		if !send(ev) {
			return
		}
	}
}
