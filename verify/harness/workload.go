package harness

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/verify/history"
)

// WorkloadOptions shape the clients of a trial.
type WorkloadOptions struct {
	Workers int           // concurrent sessions' owners
	Readers int           // goroutines doing Holder reads
	Pace    time.Duration // mean pause between a worker's operations
	// AcquireTimeout is the longest ctx timeout of an Acquire (each draws
	// one in [AcquireTimeout/20, AcquireTimeout]).
	AcquireTimeout time.Duration
}

// workload runs the clients and records everything they do in h.
type workload struct {
	sys   System
	h     *history.History
	opts  WorkloadOptions
	locks []string
	eps   []Endpoint
	fence *quorumlock.Fence
	seed  uint64

	stop    chan struct{} // the clients stop
	end     chan struct{} // the session watchers stop
	wg      sync.WaitGroup
	mu      sync.Mutex
	live    []*trackedSession
	watches sync.WaitGroup
}

// trackedSession is a session with its record in the history.
type trackedSession struct {
	s   Session
	rec *history.Session
}

func newWorkload(sys System, h *history.History, locks []string, opts WorkloadOptions, seed uint64) *workload {
	return &workload{sys: sys, h: h, opts: opts, locks: locks, eps: sys.Endpoints(), fence: quorumlock.NewFence(), seed: seed, stop: make(chan struct{}), end: make(chan struct{})}
}

func (w *workload) start() {
	for i := range w.opts.Workers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.worker(i)
		}()
	}
	for i := range w.opts.Readers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.reader(w.opts.Workers + i)
		}()
	}
}

// halt stops the clients and waits for their operations to return (each
// is bounded by its context).
func (w *workload) halt() {
	close(w.stop)
	w.wg.Wait()
}

func (w *workload) stopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// pause sleeps about d, or less if the workload stops.
func (w *workload) pause(rnd *rand.Rand, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(time.Duration(rnd.Int64N(int64(2*d)) + 1))
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.stop:
	}
}

func (w *workload) worker(id int) {
	rnd := rand.New(rand.NewPCG(w.seed, uint64(id)+1))
	var ts *trackedSession
	held := map[string]Lock{}
	home := id % len(w.eps)
	for !w.stopped() {
		if ts == nil || ts.s.Err() != nil {
			ep := w.eps[home]
			if rnd.IntN(4) == 0 {
				ep = w.eps[rnd.IntN(len(w.eps))]
			}
			ts = w.open(ep)
			clear(held)
			if ts == nil {
				w.pause(rnd, 20*time.Millisecond)
				continue
			}
		}
		for name, l := range held {
			if closed(l.Lost()) {
				delete(held, name)
			}
		}
		switch p := rnd.IntN(100); {
		case p < 3:
			w.closeSession(id, rnd, ts)
			ts = nil
		case len(held) > 0 && p < 55:
			name, l := anyLock(rnd, held)
			if !w.write(ts, name, l, rnd) || rnd.IntN(3) > 0 {
				w.release(id, rnd, ts, name, l)
				delete(held, name)
			}
		case p < 60 && len(held) > 0:
			// Keep holding, idle.
		default:
			name := w.locks[rnd.IntN(len(w.locks))]
			if _, ok := held[name]; ok || len(held) >= 2 {
				break
			}
			if l := w.acquire(id, rnd, ts, name, rnd.IntN(3) == 0); l != nil {
				held[name] = l
				w.write(ts, name, l, rnd)
			}
		}
		w.pause(rnd, w.opts.Pace)
	}
}

func anyLock(rnd *rand.Rand, held map[string]Lock) (string, Lock) {
	i := rnd.IntN(len(held))
	for name, l := range held {
		if i == 0 {
			return name, l
		}
		i--
	}
	panic("unreachable")
}

// open opens a session through ep and starts watching its end.
func (w *workload) open(ep Endpoint) *trackedSession {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s, err := ep.NewSession(ctx)
	if err != nil {
		return nil
	}
	rec := &history.Session{ID: s.ID(), Via: ep.Name(), TTL: int64(s.TTL()), Margin: int64(s.TTL() / 10), Opened: w.h.Now()}
	w.h.AddSession(rec)
	ts := &trackedSession{s: s, rec: rec}
	w.mu.Lock()
	w.live = append(w.live, ts)
	w.mu.Unlock()
	w.watches.Add(1)
	go func() {
		defer w.watches.Done()
		select {
		case <-s.Done():
			now := w.h.Now()
			err := s.Err()
			d := w.h.At(s.Deadline())
			w.h.Update(func() {
				rec.Ended, rec.Err, rec.Cause, rec.Deadline = now, errString(err), classify(err), d
			})
		case <-w.end:
		}
	}()
	return ts
}

// classify names why a session ended (history.End*).
func classify(err error) string {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	switch {
	case errors.Is(err, quorumlock.ErrClosed):
		return history.EndProcess
	case strings.Contains(msg, "abandoned"):
		return history.EndAbandoned
	case strings.Contains(msg, "the cluster ended it"):
		return history.EndCluster
	case strings.Contains(msg, "no heartbeat acknowledged"):
		return history.EndLease
	case strings.HasSuffix(msg, ": closed"):
		return history.EndClosed
	}
	return history.EndOther
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (w *workload) acquire(client int, rnd *rand.Rand, ts *trackedSession, name string, try bool) Lock {
	s := ts.s
	timeout := w.opts.AcquireTimeout
	timeout = time.Duration(rnd.Int64N(int64(timeout-timeout/20))) + timeout/20
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	op := history.Op{Client: client, Kind: history.Acquire, Lock: name, Session: s.ID(), Via: ts.rec.Via}
	if try {
		op.Kind = history.Try
	}
	op.Call = w.h.Now()
	var l Lock
	var err error
	if try {
		l, err = s.TryAcquire(ctx, name)
	} else {
		l, err = s.Acquire(ctx, name)
	}
	op.Return = w.h.Now()
	switch {
	case err == nil:
		op.Outcome, op.Token = history.OK, l.Token()
	case errors.Is(err, quorumlock.ErrLocked):
		op.Outcome = history.Locked
	case errors.Is(err, quorumlock.ErrSessionExpired), errors.Is(err, quorumlock.ErrClosed):
		// The session ended before or while the request was out: it may
		// have been applied.
		op.Outcome, op.Return = history.Ambiguous, history.Open
	case errors.Is(err, quorumlock.ErrWithdrawPending):
		// Not granted to the caller, but the withdrawal goes on in the
		// background: the acquire may still queue and be granted, and
		// such a grant is then released (token 0: the model's release of
		// a grant no acquire of the session returned), after the call
		// returned.
		w.h.Add(history.Op{Client: client, Kind: history.Release, Lock: name, Session: s.ID(), Via: ts.rec.Via,
			Outcome: history.Ambiguous, Call: op.Return, Return: history.Open, Err: "background withdrawal"})
		op.Outcome, op.Return = history.Ambiguous, history.Open
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// Settled: withdrawn, neither granted nor queued.
		op.Outcome = history.Cancelled
	default:
		op.Outcome, op.Return = history.Ambiguous, history.Open
	}
	op.Err = errString(err)
	w.h.Add(op)
	w.endedDuring(ts, op)
	return l
}

// endedDuring records op's call as the earliest time the client may have
// sent a close, if the client ended the session while op was out with an
// unknown outcome (quorumlock closes an abandoned session in the
// background). Ends decided by the cluster, or by a stopped process that
// sends nothing, keep their stricter bound.
func (w *workload) endedDuring(ts *trackedSession, op history.Op) {
	err := ts.s.Err()
	if op.Outcome != history.Ambiguous || err == nil {
		return
	}
	if c := classify(err); c == history.EndCluster || c == history.EndProcess {
		return
	}
	w.h.Update(func() {
		if ts.rec.Abandon == 0 || op.Call < ts.rec.Abandon {
			ts.rec.Abandon = op.Call
		}
	})
}

func (w *workload) release(client int, rnd *rand.Rand, ts *trackedSession, name string, l Lock) {
	timeout := time.Second
	if rnd.IntN(5) == 0 {
		// Short enough to end before the answer now and then.
		timeout = time.Duration(rnd.IntN(8)+1) * time.Millisecond
	}
	for attempt := 0; attempt < 2; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		op := history.Op{Client: client, Kind: history.Release, Lock: name, Session: ts.s.ID(), Token: l.Token(), Via: ts.rec.Via, Call: w.h.Now()}
		err := l.Release(ctx)
		cancel()
		op.Return = w.h.Now()
		switch {
		case err == nil:
			op.Outcome = history.OK
		case errors.Is(err, quorumlock.ErrNotHeld):
			op.Outcome = history.NotHeld
		default:
			op.Outcome, op.Return = history.Ambiguous, history.Open
		}
		op.Err = errString(err)
		w.h.Add(op)
		w.endedDuring(ts, op)
		// An unknown outcome is settled by releasing again, sometimes.
		if !errors.Is(err, quorumlock.ErrUnknownOutcome) || rnd.IntN(2) == 0 {
			return
		}
		timeout = time.Second
	}
}

func (w *workload) closeSession(client int, rnd *rand.Rand, ts *trackedSession) {
	timeout := time.Second
	if rnd.IntN(4) == 0 {
		timeout = time.Duration(rnd.IntN(8)+1) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	call := w.h.Now()
	err := ts.s.Close(ctx)
	ret := w.h.Now()
	w.h.Update(func() {
		if ts.rec.CloseCall == 0 {
			ts.rec.CloseCall, ts.rec.CloseReturn, ts.rec.CloseOK, ts.rec.CloseErr = call, ret, err == nil, errString(err)
		}
	})
}

// write does one write to the resource that name protects, admitted by
// the resource's Fence, while the holder's lease has room for it. It
// reports whether the lock is still usable.
func (w *workload) write(ts *trackedSession, name string, l Lock, rnd *rand.Rand) bool {
	d := time.Duration(rnd.IntN(4)+1) * time.Millisecond
	if closed(l.Lost()) || time.Until(ts.s.Deadline()) < d+ts.s.TTL()/10 {
		return false
	}
	// A pause of the holder's process here (pause-holder, pause-leader for
	// the sessions on the leader) is the case fencing exists for: the
	// write comes after the lease that allowed it, maybe after a newer
	// grant's writes.
	w.gate(ts.rec.Via)
	i, ok := w.h.Admit(history.Write{Lock: name, Session: ts.s.ID(), Token: l.Token()}, func() bool {
		return w.fence.Admit(name, quorumlock.Token(l.Token())) == nil
	})
	if !ok {
		return false
	}
	time.Sleep(d)
	w.h.Finish(i)
	return true
}

// gate holds the caller while the process that hosts its sessions (the
// endpoint named via) is paused.
func (w *workload) gate(via string) {
	if p, ok := w.sys.(Pauser); ok {
		p.Gate(via)
	}
}

func (w *workload) reader(client int) {
	rnd := rand.New(rand.NewPCG(w.seed, uint64(client)+1))
	for !w.stopped() {
		ep := w.eps[rnd.IntN(len(w.eps))]
		name := w.locks[rnd.IntN(len(w.locks))]
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		call := w.h.Now()
		info, err := ep.Holder(ctx, name)
		ret := w.h.Now()
		cancel()
		if err == nil {
			w.h.Add(history.Op{Client: client, Kind: history.Read, Lock: name, Holder: info.Holder, Token: info.Token, Waiters: info.Waiters, Via: ep.Name(), Call: call, Return: ret})
		}
		w.pause(rnd, 15*time.Millisecond)
	}
}

// sessions returns every session opened so far.
func (w *workload) sessions() []*trackedSession {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*trackedSession(nil), w.live...)
}
