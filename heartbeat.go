package quorumlock

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/clock"
)

// maxBatch bounds the sessions of one heartbeat request.
const maxBatch = 10_000

// heartbeater keeps the sessions of one Node (or client) alive: it sends
// every session a heartbeat every TTL/3, batching all sessions that are due
// into one request, and extends each session's lease from the send time of
// the batch when the leader acknowledges it (DESIGN.md invariant 5).
type heartbeater struct {
	be     backend
	clk    clock.Clock
	closed <-chan struct{}
	wake   chan struct{}
	wg     sync.WaitGroup

	mu       sync.Mutex
	sessions map[uint64]*Session
}

func newHeartbeater(be backend, clk clock.Clock, closed <-chan struct{}) *heartbeater {
	return &heartbeater{
		be:       be,
		clk:      clk,
		closed:   closed,
		wake:     make(chan struct{}, 1),
		sessions: make(map[uint64]*Session),
	}
}

// add starts heartbeating s. It reports false, and adds nothing, once the
// Node or Client is closing: loseAll (which runs after closed closes, under
// h.mu) has ended the sessions it knew, and would miss s.
func (h *heartbeater) add(s *Session) bool {
	h.mu.Lock()
	select {
	case <-h.closed:
		h.mu.Unlock()
		return false
	default:
	}
	h.sessions[s.id] = s
	h.mu.Unlock()
	h.poke()
	return true
}

func (h *heartbeater) remove(s *Session) {
	h.mu.Lock()
	if h.sessions[s.id] == s {
		delete(h.sessions, s.id)
	}
	h.mu.Unlock()
}

// idle reports whether no session is kept alive: no heartbeat goes out.
func (h *heartbeater) idle() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sessions) == 0
}

func (h *heartbeater) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// loseAll ends every session locally with err (the Node is closing).
func (h *heartbeater) loseAll(err error) {
	h.mu.Lock()
	all := make([]*Session, 0, len(h.sessions))
	for _, s := range h.sessions {
		all = append(all, s)
	}
	h.mu.Unlock()
	for _, s := range all {
		s.end(err, false)
	}
}

// background runs f in a goroutine that wait waits for. Once the Node or
// Client is closing (closed is closed) it runs nothing: f is then work
// for a cluster the closing side no longer talks to (a batch of
// heartbeats, a session's close), and an Add after wait found the count
// at zero would start a goroutine that nobody waits for (and misuse the
// WaitGroup). It reports whether it started f.
func (h *heartbeater) background(f func()) bool {
	h.mu.Lock()
	select {
	case <-h.closed:
		h.mu.Unlock()
		return false
	default:
	}
	h.wg.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.wg.Done()
		f()
	}()
	return true
}

// wait waits for the background goroutines; closed must be closed. Taking
// h.mu first orders it after every background call that saw closed open
// (its Add is done), and every later call sees closed and adds nothing.
func (h *heartbeater) wait() {
	h.mu.Lock()
	h.mu.Unlock()
	h.wg.Wait()
}

// start runs the heartbeat loop in a goroutine that wait waits for (the
// Add before the goroutine starts, so that a wait right after start does
// not miss it).
func (h *heartbeater) start() { h.background(h.run) }

func (h *heartbeater) run() {
	for {
		now := h.clk.Now()
		due, next := h.collect(now)
		for len(due) > 0 {
			batch := due[:min(len(due), maxBatch)]
			due = due[len(batch):]
			h.background(func() { h.send(batch) })
		}
		var timer clock.Timer
		if !next.IsZero() {
			timer = h.clk.AfterFunc(next.Sub(h.clk.Now()), h.poke)
		}
		select {
		case <-h.wake:
		case <-h.closed:
			if timer != nil {
				timer.Stop()
			}
			return
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// collect returns the sessions due for a heartbeat, marked in flight, and
// the earliest time another one falls due (zero if none). A session due
// within TTL/6 goes with the batch: heartbeating a little early costs
// nothing, and it aligns the sessions of a process into one batch per
// interval instead of one per session.
func (h *heartbeater) collect(now time.Time) (due []*Session, next time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.sessions {
		s.mu.Lock()
		if !s.ended && !s.hbInflight && !s.nextSend.After(now) {
			s.hbInflight = true
			due = append(due, s)
		}
		s.mu.Unlock()
	}
	for _, s := range h.sessions {
		s.mu.Lock()
		switch {
		case s.ended || s.hbInflight:
		case len(due) > 0 && !s.nextSend.After(now.Add(s.ttl/6)):
			// Due soon: joins the batch that goes now.
			s.hbInflight = true
			due = append(due, s)
		case next.IsZero() || s.nextSend.Before(next):
			next = s.nextSend
		}
		s.mu.Unlock()
	}
	slices.SortFunc(due, func(a, b *Session) int { return a.nextSend.Compare(b.nextSend) })
	return due, next
}

// send heartbeats one batch. The lease of each acknowledged session is
// extended from sent, the time the batch left, never from the answer's
// arrival.
func (h *heartbeater) send(batch []*Session) {
	ids := make([]uint64, len(batch))
	wait := MaxSessionTTL
	for i, s := range batch {
		ids[i] = s.id
		wait = min(wait, s.ttl/3)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	stop := context.AfterFunc(chanCtx(h.closed), cancel)
	sent := h.clk.Now()
	alive, gone, err := h.be.keepAlive(ctx, ids)
	stop()
	cancel()
	now := h.clk.Now()
	ack := make(map[uint64]bool, len(alive))
	for _, id := range alive {
		ack[id] = true
	}
	isGone := make(map[uint64]bool, len(gone))
	for _, id := range gone {
		isGone[id] = true
	}
	for _, s := range batch {
		switch {
		case err == nil && ack[s.id]:
			s.renewed(sent)
		case err == nil && isGone[s.id]:
			s.end(errExpiredOnCluster, false)
		default:
			s.heartbeatFailed(now)
		}
	}
	h.poke()
}
