package quorumlock

import (
	"context"
	"fmt"
)

// orBackground returns ctx, or context.Background() for a nil ctx: every
// call that takes a ctx treats nil as "no deadline, never cancelled"
// rather than panicking (the context package's functions panic on a nil
// parent), as context.TODO would be.
func orBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}

// closedChan is what Done and Lost return on a nil or zero Session, Lock
// or Leadership: nothing is held through them.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// endedCtx is the Context of a nil or zero Leadership.
var endedCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// errNoSession is returned by the calls of a nil or zero Session (one
// that no NewSession returned, such as the nil of a failed NewSession).
var errNoSession = fmt.Errorf("%w: not an open session (a nil or zero Session)", ErrSessionExpired)

// errNoGrant is returned by Release, Resign and Proclaim on a nil or zero
// Lock or Leadership (the nil of a failed Acquire or Elect, say).
var errNoGrant = fmt.Errorf("%w: not a grant (a nil or zero Lock or Leadership)", ErrNotHeld)

// nilSession reports whether s is nil or a zero Session.
func (s *Session) nilSession() bool { return s == nil || s.be == nil }

// nilLock reports whether l is nil or a zero Lock.
func (l *Lock) nilLock() bool { return l == nil || l.s.nilSession() }

// nilLeadership reports whether l is nil or a zero Leadership.
func (l *Leadership) nilLeadership() bool {
	return l == nil || l.s.nilSession() || l.lock.nilLock() || l.ctx == nil
}
