package quorumlock

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// openCalls tracks the NewSession calls of one Node or Client by open ID
// (lockpb.Request.open_id): each call draws one and sends it on every
// attempt, and while the session an attempt opened lives, the cluster
// answers every other attempt with that session instead of opening
// another.
//
// The answer of an attempt the caller abandoned (propStream.
// abandonedOpens) may come later. Closing its session then, as for an
// open without an ID, would close the very session a later attempt of the
// same call receives, or received already. So such an answer closes its
// session only once the call has failed (no attempt will take the
// session); while the call goes on it is kept with the call, and closed
// if the call fails; once the call succeeded (its session is this one,
// or one opened after this one ended) it is left alone, and so is one of
// a call forgotten (failed over abandonedOpenTTL ago): the leader expires
// a session whose opener gave up before its answer, and otherwise the
// session ends after its TTL, unheartbeated.
type openCalls struct {
	mu    sync.Mutex
	calls map[uint64]*openCall
	// failedOrder lists the failed calls still in calls, oldest first:
	// each is forgotten after abandonedOpenTTL, and the oldest first past
	// maxAbandonedOpens.
	failedOrder []abandonedOpen
}

type openCall struct {
	failed bool
	// late are the answers of abandoned attempts that came while the call
	// went on, each with the stream it came on.
	late []lateOpen
}

type lateOpen struct {
	ps   *propStream
	resp *lockpb.Response
}

func newOpenCalls() *openCalls {
	return &openCalls{calls: make(map[uint64]*openCall)}
}

// start registers a new call and returns its open ID: random, non-zero,
// and no other call's of this process.
func (o *openCalls) start() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	for {
		if id := rand.Uint64(); id != 0 && o.calls[id] == nil {
			o.calls[id] = &openCall{}
			return id
		}
	}
}

// end records the outcome of call id: opened (the caller has its session)
// or failed. A failed call's sessions from late answers are closed, and so
// are those of answers that come within abandonedOpenTTL.
func (o *openCalls) end(id uint64, opened bool) {
	o.mu.Lock()
	c := o.calls[id]
	if c == nil || opened {
		delete(o.calls, id)
		o.mu.Unlock()
		return
	}
	c.failed = true
	late := c.late
	c.late = nil
	now := time.Now()
	drop := 0
	for drop < len(o.failedOrder) && (len(o.failedOrder)-drop >= maxAbandonedOpens || now.Sub(o.failedOrder[drop].at) > abandonedOpenTTL) {
		delete(o.calls, o.failedOrder[drop].id)
		drop++
	}
	o.failedOrder = append(o.failedOrder[drop:], abandonedOpen{id, now})
	o.mu.Unlock()
	for _, l := range late {
		l.ps.closeOpened(l.resp)
	}
}

// lateAnswer is told resp, the answer (on ps) to an abandoned attempt of
// open id, and reports whether ps should close the session it names now
// (see openCalls).
func (o *openCalls) lateAnswer(id uint64, ps *propStream, resp *lockpb.Response) bool {
	if o == nil {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.calls[id]
	switch {
	case c == nil:
		return false
	case c.failed:
		return true
	}
	c.late = append(c.late, lateOpen{ps, resp})
	return false
}
