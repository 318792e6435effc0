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

// errNoNode is returned by the calls of a nil or zero Node (the nil of a
// failed Start, say), and errNoClient by those of a nil or zero Client
// (the nil of a failed Dial): nothing runs behind them, as after Close.
var (
	errNoNode   = fmt.Errorf("%w: not a started replica (a nil or zero Node)", ErrClosed)
	errNoClient = fmt.Errorf("%w: not a dialled client (a nil or zero Client)", ErrClosed)
)

// errNoFence is returned by Admit on a nil Fence: it has nowhere to record
// a token, so it admits none (a resource must not run unfenced).
var errNoFence = fmt.Errorf("%w: a nil Fence (use NewFence, or a zero Fence)", ErrInvalidConfig)

// nilNode reports whether n is nil or a zero Node (Start sets hb last).
func (n *Node) nilNode() bool { return n == nil || n.hb == nil }

// nilClient reports whether c is nil or a zero Client.
func (c *Client) nilClient() bool { return c == nil || c.hb == nil }

// nilSession reports whether s is nil or a zero Session.
func (s *Session) nilSession() bool { return s == nil || s.be == nil }

// nilLock reports whether l is nil or a zero Lock.
func (l *Lock) nilLock() bool { return l == nil || l.s.nilSession() }

// nilLeadership reports whether l is nil or a zero Leadership.
func (l *Leadership) nilLeadership() bool {
	return l == nil || l.s.nilSession() || l.lock.nilLock() || l.ctx == nil
}
