package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
	"github.com/quorumlock/quorumlock/internal/testhook"
)

// TestReviewAJNoLostWakeup races a blocking Acquire, which the leader
// defers while the lock is held, against the holder's release, its
// session's close, its session's end by its replica's crash, and a
// leadership transfer at the same moment. The waiter must be granted,
// with a larger token, within a bounded time every round.
func TestReviewAJNoLostWakeup(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 3 * time.Second})
	c.WaitLeader(10 * time.Second)
	cl := dial(t, addrsOf(c, c.IDs()...),
		quorumlock.WithDialer(c.Net.Dialer(100)),
		quorumlock.WithSessionTTL(3*time.Second),
		quorumlock.WithElectionTimeout(c.ElectionTimeout()))
	rnd := rand.New(rand.NewPCG(3, 5))
	openers := func() []opener {
		var out []opener
		for _, id := range c.Running() {
			out = append(out, c.Node(id))
		}
		return append(out, cl)
	}
	const rounds = 80
	var last quorumlock.Token
	for i := range rounds {
		ops := openers()
		h := newSession(t, ops[rnd.IntN(len(ops))])
		w := newSession(t, ops[rnd.IntN(len(ops))])
		hl := mustAcquire(t, h, "wake")
		if hl.Token() <= last {
			t.Fatalf("round %d: token %d after %d", i, hl.Token(), last)
		}
		res := acquireAsync(testCtx(t, 20*time.Second), w, "wake")
		time.Sleep(time.Duration(rnd.IntN(3000)) * time.Microsecond)
		what := i % 4
		switch what {
		case 0: // release
			if err := hl.Release(testCtx(t, 5*time.Second)); err != nil {
				t.Fatalf("round %d: Release: %v", i, err)
			}
		case 1: // session close
			if err := h.Close(testCtx(t, 5*time.Second)); err != nil {
				t.Fatalf("round %d: Close: %v", i, err)
			}
		case 2: // release racing a leadership transfer
			ld := c.Leader()
			go func() {
				if ld != 0 {
					testhook.TransferLeadership(c.Node(ld), follower(c, ld))
				}
			}()
			if err := hl.Release(testCtx(t, 5*time.Second)); err != nil && !errors.Is(err, quorumlock.ErrNotHeld) {
				t.Fatalf("round %d: Release during transfer: %v", i, err)
			}
		case 3: // release racing a leader crash
			ld := c.Leader()
			go func() {
				if ld != 0 {
					c.Stop(ld)
				}
			}()
			err := hl.Release(testCtx(t, 10*time.Second))
			if err != nil && !errors.Is(err, quorumlock.ErrNotHeld) && !errors.Is(err, quorumlock.ErrClosed) {
				t.Fatalf("round %d: Release during leader crash: %v", i, err)
			}
			// The crashed leader restarts below, after the waiter's outcome.
			start := time.Now()
			var r acquireResult
			select {
			case r = <-res:
			case <-time.After(12 * time.Second):
				info, _ := cl.Holder(testCtx(t, 5*time.Second), "wake")
				t.Fatalf("round %d (leader %d crashed): waiter session %d not answered 12 s after the release; table %+v", i, ld, w.ID(), info)
			}
			if r.err != nil {
				if !closed(w.Done()) {
					t.Fatalf("round %d: waiter on a live session: %v", i, r.err)
				}
			} else {
				if r.l.Token() <= hl.Token() {
					t.Fatalf("round %d: waiter token %d after %d", i, r.l.Token(), hl.Token())
				}
				last = r.l.Token()
				r.l.Release(testCtx(t, 5*time.Second))
			}
			t.Logf("round %d: leader %d crashed, waiter answered after %v: %v", i, ld, time.Since(start), r.err)
			h.Close(testCtx(t, 5*time.Second))
			w.Close(testCtx(t, 5*time.Second))
			c.WaitLeader(10 * time.Second)
			for _, id := range c.IDs() {
				if c.Node(id) == nil {
					c.Restart(id)
				}
			}
			c.WaitLeader(10 * time.Second)
			continue
		}
		start := time.Now()
		select {
		case r := <-res:
			if r.err != nil {
				t.Fatalf("round %d (%d): waiter: %v", i, what, r.err)
			}
			if r.l.Token() <= hl.Token() {
				t.Fatalf("round %d: waiter token %d after %d", i, r.l.Token(), hl.Token())
			}
			last = r.l.Token()
			if err := r.l.Release(testCtx(t, 5*time.Second)); err != nil {
				t.Fatalf("round %d: waiter's Release: %v", i, err)
			}
		case <-time.After(5 * time.Second):
			info, _ := cl.Holder(testCtx(t, 5*time.Second), "wake")
			t.Fatalf("round %d (%d): waiter session %d not granted 5 s after the holder let go; table %+v", i, what, w.ID(), info)
		}
		if d := time.Since(start); d > time.Second {
			t.Logf("round %d (%d): grant took %v after the release", i, what, d)
		}
		h.Close(testCtx(t, 5*time.Second))
		w.Close(testCtx(t, 5*time.Second))
	}
}

// TestReviewAJCancelledWaitersLeaveLockFree: six sessions, three calls
// each, Acquire the same name with random short deadlines (some long),
// hold briefly and release, for a few seconds. Calls of one session share
// its grant. No two sessions hold at once, and once every call has
// returned and every returned grant is released, the lock is free and
// nobody waits: no grant stays with a caller that got an error.
func TestReviewAJCancelledWaitersLeaveLockFree(t *testing.T) {
	ajCancelledWaiters(t, false)
}

// TestReviewAJCancelledWaitersUnderLeaderChurn is the same while the
// leadership is transferred and the leader isolated for short moments:
// withdrawals then go on in the background (ErrWithdrawPending).
func TestReviewAJCancelledWaitersUnderLeaderChurn(t *testing.T) {
	ajCancelledWaiters(t, true)
}

func ajCancelledWaiters(t *testing.T, churn bool) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	c.WaitLeader(10 * time.Second)
	nemDone := make(chan struct{})
	if churn {
		go func() {
			defer close(nemDone)
			rnd := rand.New(rand.NewPCG(9, 9))
			for i := range 12 {
				time.Sleep(time.Duration(150+rnd.IntN(300)) * time.Millisecond)
				ld := c.Leader()
				if ld == 0 {
					continue
				}
				if i%3 == 2 {
					c.Isolate(ld)
					time.Sleep(time.Duration(100+rnd.IntN(300)) * time.Millisecond)
					c.Heal()
				} else {
					testhook.TransferLeadership(c.Node(ld), follower(c, ld))
				}
			}
		}()
	} else {
		close(nemDone)
	}
	cs := newAJCS("cx")
	var mu sync.Mutex
	var holders = map[uint64][]*quorumlock.Lock{} // session -> grants its calls hold
	releasing := map[quorumlock.Token]bool{}      // grants a call started to release
	var violations []string
	var errCount = map[string]int{}
	var wg sync.WaitGroup
	t0 := time.Now()
	trace := map[uint64][]string{}
	ev := func(sid uint64, k int, format string, args ...any) {
		mu.Lock()
		trace[sid] = append(trace[sid], fmt.Sprintf("%8.3fms call %d: ", float64(time.Since(t0).Microseconds())/1000, k)+fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	bad := map[uint64]bool{}
	stop := time.Now().Add(6 * time.Second)
	var sessions []*quorumlock.Session
	for i := range 6 {
		s := newSession(t, c.Node(c.IDs()[i%3]))
		sessions = append(sessions, s)
		for k := range 3 {
			wg.Go(func() {
				rnd := rand.New(rand.NewPCG(uint64(i), uint64(k)))
				for time.Now().Before(stop) {
					d := time.Duration(1+rnd.IntN(40)) * time.Millisecond
					if rnd.IntN(4) == 0 {
						d = 3 * time.Second
					}
					ctx, cancel := context.WithTimeout(context.Background(), d)
					ev(s.ID(), k, "Acquire(%v)", d)
					l, err := s.Acquire(ctx, "cx")
					cancel()
					if err != nil {
						ev(s.ID(), k, "Acquire error: %v", err)
						mu.Lock()
						key := err.Error()
						if errors.Is(err, context.DeadlineExceeded) {
							key = "deadline"
							if errors.Is(err, quorumlock.ErrWithdrawPending) {
								key = "deadline+withdraw pending"
							}
						}
						errCount[key]++
						mu.Unlock()
						continue
					}
					ev(s.ID(), k, "granted token %d", l.Token())
					mu.Lock()
					// A grant a Release of the session (another call's)
					// is already giving up is not held: that Release
					// frees it for everyone.
					if !releasing[l.Token()] {
						holders[s.ID()] = append(holders[s.ID()], l)
					}
					for other, ls := range holders {
						for _, ol := range ls {
							if other != s.ID() && !closed(ol.Lost()) && !closed(l.Lost()) && !releasing[l.Token()] {
								violations = append(violations, fmt.Sprintf("%8.3fms session %d granted token %d while session %d holds token %d (Lost open)", float64(time.Since(t0).Microseconds())/1000, s.ID(), l.Token(), other, ol.Token()))
								bad[other], bad[s.ID()] = true, true
							}
						}
					}
					if err := cs.fence.Admit("cx", l.Token()); err != nil && !closed(l.Lost()) && !releasing[l.Token()] {
						violations = append(violations, fmt.Sprintf("session %d token %d: %v", s.ID(), l.Token(), err))
					}
					mu.Unlock()
					time.Sleep(time.Duration(rnd.IntN(2000)) * time.Microsecond)
					// A Release by any call gives the grant up for every
					// call of the session that shares it.
					mu.Lock()
					releasing[l.Token()] = true
					holders[s.ID()] = slices.DeleteFunc(holders[s.ID()], func(o *quorumlock.Lock) bool { return o.Token() == l.Token() })
					mu.Unlock()
					rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
					ev(s.ID(), k, "Release token %d", l.Token())
					err = l.Release(rctx)
					ev(s.ID(), k, "Release token %d: %v", l.Token(), err)
					rcancel()
					if err != nil && !errors.Is(err, quorumlock.ErrNotHeld) {
						mu.Lock()
						errCount["release: "+err.Error()]++
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	<-nemDone
	ld := c.WaitLeader(10 * time.Second)
	n := 0
	for k, v := range errCount {
		if strings.Contains(k, "freed by a concurrent Release") {
			n += v
			delete(errCount, k)
		}
	}
	t.Logf("errors: %v; ErrNotHeld (grant freed by a concurrent Release of the session): %d", errCount, n)
	for _, v := range violations[:min(len(violations), 10)] {
		t.Error(v)
	}
	for sid := range bad {
		tr := trace[sid]
		t.Logf("session %d's calls (last %d):\n%s", sid, min(len(tr), 60), strings.Join(tr[max(0, len(tr)-60):], "\n"))
	}
	if info, free := waitFree(t, c.Node(ld), "cx", 8*time.Second); !free {
		var held []string
		for _, s := range sessions {
			held = append(held, fmt.Sprintf("session %d: %d locks, err %v", s.ID(), len(s.Locks()), s.Err()))
		}
		t.Fatalf("8 s after every call returned and every grant was released: %+v; %v", info, held)
	}
	for _, s := range sessions {
		if closed(s.Done()) {
			t.Errorf("session %d ended: %v", s.ID(), s.Err())
		}
		if ls := s.Locks(); len(ls) != 0 && slices.ContainsFunc(ls, func(l *quorumlock.Lock) bool { return !closed(l.Lost()) }) {
			t.Errorf("session %d still lists %d locks", s.ID(), len(ls))
		}
	}
}
