package quorumlock

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// Lock is one grant of a named lock to a session. Its methods are safe for
// concurrent use.
type Lock struct {
	s     *Session
	name  string
	token Token

	// Guarded by s.mu. The channel is made on the first call of Lost: most
	// holders never ask, and a channel costs more than the rest of a Lock.
	lost chan struct{}
	gone bool // lost, or closed as soon as it is made

	// resigning counts the Resigns giving up this grant (a role's) whose
	// release is in flight, from before any handle's Done closes until
	// the release is answered: Session.Elect answered with the grant must
	// not hand it out again.
	resigning atomic.Int32
}

// Name returns the lock's name.
func (l *Lock) Name() string {
	if l == nil {
		return ""
	}
	return l.name
}

// Token returns the grant's fencing token: the raft index of the log entry
// whose application granted it. Pass it to the protected resource, which
// checks it with a Fence.
func (l *Lock) Token() Token {
	if l == nil {
		return 0
	}
	return l.token
}

// Session returns the session that holds the lock.
func (l *Lock) Session() *Session {
	if l == nil {
		return nil
	}
	return l.s
}

// Lost is closed when the holder can no longer vouch that it holds the lock:
// the lock was released, the session ended (closed, expired on the cluster,
// or past its client-side lease), or the Node or Client the session was
// opened through closed. Stop using the protected resource when it closes;
// the fencing token protects against the window in which this notice is
// late (a paused process). When the session's end is the cause, Session.Err
// reports it by the time Lost closes, and the session's Done closes right
// after (every Lost first: see Session.Done).
func (l *Lock) Lost() <-chan struct{} {
	if l.nilLock() {
		return closedChan
	}
	l.s.checkLeaseNow()
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.lost == nil {
		l.lost = make(chan struct{})
		if l.gone {
			close(l.lost)
		}
	}
	return l.lost
}

func (l *Lock) markLost() {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	l.markLostLocked()
}

// markLostLocked is markLost with l.s.mu held.
func (l *Lock) markLostLocked() {
	if !l.gone {
		l.gone = true
		if l.lost != nil {
			close(l.lost)
		}
	}
}

// Release frees the lock if this grant is still current; the next waiter is
// granted with a larger token. The release names the token (DESIGN.md
// invariant 7): a late or repeated release never frees a newer grant.
// Lost closes in every case but those that return ErrUnknownOutcome (ctx
// ended, or ErrLimit), where the lock may still be held.
//
// Errors: ErrNotHeld (the grant is no longer current), ErrLimit wrapped
// with ErrUnknownOutcome (refused: the session has too many requests
// pending on the cluster; the lock stays listed, but another copy of the
// request may still take effect: calling Release again settles it),
// ErrSessionExpired,
// ErrClosed, ErrUnknownOutcome wrapping ctx's error when ctx ended before
// the answer (the release may or may not have happened; calling Release
// again settles it). On a nil or zero Lock (the nil of a failed Acquire)
// it returns ErrNotHeld, and Lost a closed channel.
func (l *Lock) Release(ctx context.Context) error {
	if l.nilLock() {
		return errNoGrant
	}
	ctx = orBackground(ctx)
	s := l.s
	if err := s.Err(); err != nil {
		return err
	}
	q := s.nextSeq()
	defer s.finish(q.seq)
	resp, err := s.call(ctx, q.request(&lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: s.id, Name: l.name, Token: uint64(l.token)}))
	if err != nil {
		if ctx.Err() != nil && s.Err() == nil {
			return fmt.Errorf("%w: releasing %s: %w", ErrUnknownOutcome, keyLabel(l.name), err)
		}
		return err
	}
	if resp.GetCode() == lockpb.Code_CODE_LIMIT {
		// Refused: this copy changed nothing, so the lock stays listed.
		// Another copy of the request (re-sent after a leader change)
		// may still be applied, so the outcome is not settled.
		return fmt.Errorf("%w: %w: releasing %s: too many requests of this session pending", ErrUnknownOutcome, ErrLimit, keyLabel(l.name))
	}
	s.dropLock(l)
	l.markLost()
	switch resp.GetCode() {
	case lockpb.Code_CODE_OK:
		return nil
	case lockpb.Code_CODE_NOT_HELD:
		return fmt.Errorf("%w: %s token %d", ErrNotHeld, keyLabel(l.name), l.token)
	default:
		return fmt.Errorf("quorumlock: releasing %s: %s", keyLabel(l.name), resp.GetCode())
	}
}
