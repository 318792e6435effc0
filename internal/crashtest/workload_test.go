package crashtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// The workload: each client owns one session and holds or waits for at
// most one lock at a time. From idle it acquires a random lock (try, or
// no-wait queueing); holding, it releases with its token; queued, it polls
// its acquire (re-sending the same (session, seq), which answers the
// acquire's current state) or withdraws it. Every request is re-sent with
// the same (session, seq) to whichever replica leads until it gets a
// definite answer (DESIGN.md invariant 6), so each client knows exactly
// what it holds: a release must succeed, a session must never be missing.

const (
	sessionTTL  = time.Minute
	opTimeout   = 20 * time.Second       // bound on getting a definite answer
	tryTimeout  = 300 * time.Millisecond // bound on one attempt
	retryPause  = time.Millisecond
	pageOfLocks = 1000
)

type clientState int

const (
	idle clientState = iota
	holding
	queued
)

type client struct {
	w       *workload
	session uint64
	rng     *rand.Rand
	seq     uint64

	state  clientState
	name   string
	cur    *grant // holding
	acqSeq uint64 // queued: the acquire's seq
}

type workload struct {
	c      *cluster
	h      *history
	names  []string
	client []*client
	ops    atomic.Int64 // definite answers
	stopc  chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

// startWorkload opens a session per client and starts the clients.
func startWorkload(c *cluster, seed uint64, clients, locks int) *workload {
	c.t.Helper()
	w := &workload{c: c, h: &history{}, stopc: make(chan struct{})}
	for i := range locks {
		w.names = append(w.names, fmt.Sprintf("lock-%d", i))
	}
	for i := range clients {
		resp := w.propose(&lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: sessionTTL.Milliseconds()})
		if resp == nil || resp.GetCode() != lockpb.Code_CODE_OK {
			c.t.Fatalf("opening session %d: %v (%v)", i, resp, w.h.anomalies())
		}
		w.client = append(w.client, &client{w: w, session: resp.GetSession(), rng: rand.New(rand.NewPCG(seed, uint64(i)))})
	}
	for _, cl := range w.client {
		w.wg.Go(cl.run)
	}
	c.t.Cleanup(w.stop)
	return w
}

// propose sends req to the leader until it gets a definite answer, or
// records an anomaly and returns nil after opTimeout.
func (w *workload) propose(req *lockpb.Request) *lockpb.Response {
	deadline := time.Now().Add(opTimeout)
	for time.Now().Before(deadline) {
		lead := w.c.leader()
		if lead == nil {
			time.Sleep(retryPause)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), tryTimeout)
		resp, err := lead.svc.Propose(ctx, proto.Clone(req).(*lockpb.Request))
		cancel()
		if err == nil && resp.GetCode() != lockpb.Code_CODE_NOT_LEADER && resp.GetCode() != lockpb.Code_CODE_UNAVAILABLE {
			w.ops.Add(1)
			return resp
		}
		time.Sleep(retryPause)
	}
	w.h.anomaly("no definite answer to %v within %v", req, opTimeout)
	return nil
}

// waitOps waits until n more requests got a definite answer.
func (w *workload) waitOps(n int64) {
	w.c.t.Helper()
	target := w.ops.Load() + n
	w.c.waitFor(fmt.Sprintf("%d answered requests", target), func() bool {
		if errs := w.h.anomalies(); len(errs) > 0 {
			w.c.t.Fatalf("workload: %v", errs)
		}
		return w.ops.Load() >= target
	})
}

// waitGrant waits until a client learned a grant after logical time since
// (history.now), the sign that the cluster serves again. A count of
// answered requests is not: right after a leader change one client can
// get dozens of answers (try-acquires answered LOCKED, polls of a queued
// acquire, withdrawals) in the millisecond the holders of every lock
// spend in their retry pause, and none of them is a grant.
func (w *workload) waitGrant(what string, since uint64) {
	w.c.t.Helper()
	w.c.waitFor(what, func() bool {
		if errs := w.h.anomalies(); len(errs) > 0 {
			w.c.t.Fatalf("workload: %v", errs)
		}
		return w.h.grantsSince(since) > 0
	})
}

// stop makes every client finish: a queued client withdraws, then each
// stops, holding at most one lock.
func (w *workload) stop() {
	w.once.Do(func() { close(w.stopc) })
	w.wg.Wait()
}

func (w *workload) stopping() bool {
	select {
	case <-w.stopc:
		return true
	default:
		return false
	}
}

func (cl *client) run() {
	for {
		if cl.w.stopping() && cl.state != queued {
			return
		}
		if !cl.step() {
			return
		}
	}
}

// step makes one request and updates the client's state from its answer.
// It returns false after an anomaly.
func (cl *client) step() bool {
	h := cl.w.h
	switch cl.state {
	case idle:
		cl.seq++
		name := cl.w.names[cl.rng.IntN(len(cl.w.names))]
		try := cl.rng.IntN(3) == 0
		req := &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: cl.session, Seq: cl.seq, Done: cl.seq, Name: name, Try: try, NoWait: true}
		resp := cl.w.propose(req)
		switch {
		case resp == nil:
			return false
		case resp.GetCode() == lockpb.Code_CODE_OK && !resp.GetQueued():
			cl.state, cl.name, cl.cur = holding, name, h.learn(name, cl.session, resp.GetToken())
		case resp.GetCode() == lockpb.Code_CODE_OK && !try:
			cl.state, cl.name, cl.acqSeq = queued, name, cl.seq
		case resp.GetCode() == lockpb.Code_CODE_LOCKED && try:
			// Still idle.
		default:
			h.anomaly("session %d: %v answered %v", cl.session, req, resp)
			return false
		}
	case holding:
		cl.seq++
		req := &lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: cl.session, Seq: cl.seq, Done: cl.seq, Name: cl.name, Token: cl.cur.token}
		h.releasing(cl.cur)
		resp := cl.w.propose(req)
		if resp == nil {
			return false
		}
		if resp.GetCode() != lockpb.Code_CODE_OK || resp.GetToken() != cl.cur.token {
			h.anomaly("session %d: release of its acknowledged grant %q token %d answered %v", cl.session, cl.name, cl.cur.token, resp)
			return false
		}
		cl.state, cl.cur = idle, nil
	case queued:
		if !cl.w.stopping() && cl.rng.IntN(3) > 0 {
			req := &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: cl.session, Seq: cl.acqSeq, Done: cl.acqSeq, Name: cl.name, NoWait: true}
			resp := cl.w.propose(req)
			switch {
			case resp == nil:
				return false
			case resp.GetCode() == lockpb.Code_CODE_OK && !resp.GetQueued():
				cl.state, cl.cur = holding, h.learn(cl.name, cl.session, resp.GetToken())
			case resp.GetCode() == lockpb.Code_CODE_OK:
				// Still queued.
			default:
				h.anomaly("session %d: poll of its queued acquire %v answered %v", cl.session, req, resp)
				return false
			}
			return true
		}
		cl.seq++
		req := &lockpb.Request{Op: lockpb.Op_OP_WITHDRAW, Session: cl.session, Seq: cl.seq, Done: cl.acqSeq, Name: cl.name, Target: cl.acqSeq}
		resp := cl.w.propose(req)
		switch {
		case resp == nil:
			return false
		case resp.GetCode() == lockpb.Code_CODE_OK:
			cl.state, cl.cur = holding, h.learn(cl.name, cl.session, resp.GetToken())
		case resp.GetCode() == lockpb.Code_CODE_WITHDRAWN:
			cl.state = idle
		default:
			h.anomaly("session %d: withdraw %v answered %v", cl.session, req, resp)
			return false
		}
	}
	return true
}
