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

	"go.uber.org/goleak"

	"github.com/quorumlock/quorumlock"
)

// reviewJNames are the lock names the stress tests share.
var reviewJNames = []string{"j0", "j1", "j2", "j3"}

// reviewJAllowed reports whether err is one of the outcomes the API
// documents for a lock call on a live session under a short ctx.
func reviewJAllowed(err error) bool {
	return err == nil ||
		errors.Is(err, quorumlock.ErrLocked) ||
		errors.Is(err, quorumlock.ErrNotHeld) ||
		errors.Is(err, quorumlock.ErrUnknownOutcome) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled) ||
		errors.Is(err, quorumlock.ErrWithdrawPending)
}

// reviewJCheckTable checks, with nothing in flight, that the session's own
// view (Locks) and the cluster's table agree: every name the table shows s
// holding is in s.Locks() with the same token and its Lost open, every
// other Lock s ever got has Lost closed, and s waits for nothing. A
// withdrawal still going on in the background (ErrWithdrawPending) may
// leave s queued, or holding a grant it releases, for a while: the check
// is repeated for up to 10 s.
func reviewJCheckTable(t *testing.T, o opener, s *quorumlock.Session, got []*quorumlock.Lock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		problems := reviewJTableProblems(t, o, s, got)
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range problems {
				t.Error(p)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func reviewJTableProblems(t *testing.T, o opener, s *quorumlock.Session, got []*quorumlock.Lock) []string {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	var out []string
	mine := map[string]*quorumlock.Lock{}
	for _, l := range s.Locks() {
		mine[l.Name()] = l
	}
	for _, name := range reviewJNames {
		info, err := o.Holder(ctx, name)
		if err != nil {
			t.Fatalf("Holder(%q): %v", name, err)
		}
		if slices.Contains(info.Waiters, s.ID()) {
			out = append(out, fmt.Sprintf("%q: session %d still queued with nothing in flight: %+v", name, s.ID(), info))
		}
		l := mine[name]
		switch {
		case info.Holder == s.ID() && l == nil:
			out = append(out, fmt.Sprintf("%q: the table shows session %d holding token %d; the session does not know it", name, s.ID(), info.Token))
		case info.Holder != s.ID() && l != nil:
			out = append(out, fmt.Sprintf("%q: the session believes it holds token %d; the table shows %+v", name, l.Token(), info))
		case l != nil && l.Token() != info.Token:
			out = append(out, fmt.Sprintf("%q: the session holds token %d, the table %d", name, l.Token(), info.Token))
		case l != nil && closed(l.Lost()):
			out = append(out, fmt.Sprintf("%q: held lock with Lost closed", name))
		}
	}
	for _, l := range got {
		if mine[l.Name()] != l && !closed(l.Lost()) {
			out = append(out, fmt.Sprintf("%q token %d: no longer the session's grant, but Lost is open", l.Name(), l.Token()))
		}
	}
	return out
}

// Many goroutines share one Session (on a replica and through a client)
// and call Acquire, TryAcquire and Release on a few names, with short and
// cancelled contexts, while another session competes for the same names.
// Every call returns a documented outcome, and afterwards the session's
// view and the cluster's table agree.
func TestReviewJSharedSessionStress(t *testing.T) {
	t.Parallel()
	nodes := specCluster(t, 3, nil)
	for _, op := range specOpeners(t, nodes) {
		t.Run(op.name, func(t *testing.T) { reviewJStress(t, op.o, nil) })
	}
}

// The same across a leader change: the leader replica closes (handing
// leadership over) in the middle of the run. Calls may then also return
// ErrWithdrawPending; the session survives, and once the background work
// is done its view and the table agree.
func TestReviewJSharedSessionStressAcrossLeaderChange(t *testing.T) {
	t.Parallel()
	for _, remote := range []bool{false, true} {
		t.Run(fmt.Sprint("remote=", remote), func(t *testing.T) {
			nodes := specCluster(t, 3, nil)
			lead := specLeader(t, nodes)
			var o opener = nodes[(lead+1)%3]
			if remote {
				o = specDial(t, nodes)
			}
			reviewJStress(t, o, func() { nodes[lead].Close() })
		})
	}
}

// reviewJStress runs the shared-session stress through o, calling
// midway (if not nil) a second into the run.
func reviewJStress(t *testing.T, o opener, midway func()) {
	ctx := testCtx(t, 30*time.Second)
	s := specSession(ctx, t, o)
	rival := specSession(ctx, t, o)
	if midway != nil {
		time.AfterFunc(time.Second, midway)
	}
	var mu sync.Mutex
	var got, unknown []*quorumlock.Lock
	var wg sync.WaitGroup
	stop := time.Now().Add(2 * time.Second)
	if midway != nil {
		stop = stop.Add(time.Second)
	}
	worker := func(w int, sess *quorumlock.Session, record bool) {
		defer wg.Done()
		r := rand.New(rand.NewPCG(uint64(w), 7))
		for time.Now().Before(stop) {
			name := reviewJNames[r.IntN(len(reviewJNames))]
			cctx, cancel := context.WithTimeout(ctx, time.Duration(1+r.IntN(40))*time.Millisecond)
			if r.IntN(8) == 0 {
				cancel()
			}
			var l *quorumlock.Lock
			var err error
			if r.IntN(2) == 0 {
				l, err = sess.Acquire(cctx, name)
			} else {
				l, err = sess.TryAcquire(cctx, name)
			}
			cancel()
			if !reviewJAllowed(err) {
				t.Errorf("worker %d: acquire %q: %v", w, name, err)
				return
			}
			if err == nil {
				if l == nil || l.Name() != name || l.Token() == 0 {
					t.Errorf("worker %d: acquire %q returned %v", w, name, l)
					return
				}
				if record {
					mu.Lock()
					got = append(got, l)
					mu.Unlock()
				}
				if r.IntN(3) > 0 {
					rctx, rcancel := context.WithTimeout(ctx, time.Duration(1+r.IntN(40))*time.Millisecond)
					err := l.Release(rctx)
					rcancel()
					if !reviewJAllowed(err) {
						t.Errorf("worker %d: release %q: %v", w, name, err)
						return
					}
					if errors.Is(err, quorumlock.ErrUnknownOutcome) && record {
						mu.Lock()
						unknown = append(unknown, l)
						mu.Unlock()
					}
					if err == nil && !closed(l.Lost()) {
						t.Errorf("worker %d: released %q, Lost open", w, name)
					}
				}
			}
		}
	}
	for w := range 8 {
		wg.Add(1)
		go worker(w, s, true)
	}
	for w := 8; w < 10; w++ {
		wg.Add(1)
		go worker(w, rival, false)
	}
	wg.Wait()
	if err := s.Err(); err != nil {
		t.Fatalf("session ended: %v", err)
	}
	if err := rival.Err(); err != nil {
		t.Fatalf("rival session ended: %v", err)
	}
	// A release whose outcome is unknown is settled by calling
	// it again (Lock.Release).
	for _, l := range unknown {
		if err := l.Release(ctx); err != nil && !errors.Is(err, quorumlock.ErrNotHeld) {
			t.Errorf("settling release %q: %v", l.Name(), err)
		}
	}
	reviewJCheckTable(t, o, s, got)
	// Release what is left; then nothing is held by s.
	for _, l := range s.Locks() {
		if err := l.Release(ctx); err != nil {
			t.Errorf("final release %q: %v", l.Name(), err)
		}
	}
	reviewJCheckTable(t, o, s, got)
	t.Logf("%d grants", len(got))
}

// A client's calls with contexts too short for a round trip (each one
// ends at the healthy leader, and the client forgets that leader, as it
// must for a silent one) do not unsettle the client's other calls: the
// next call, redirected back to the same leader by a follower, used to
// count as a leader move, which aborted every call waiting at the leader,
// and each aborted call forgot the leader again. With a stable leader,
// Acquires stopped by their deadline then could not withdraw in time
// (ErrWithdrawPending, 5-10 of 20) and TryAcquires with half a second to
// spare timed out. This end-to-end form no longer reproduces that bug
// reliably on today's client (a re-creation of it in setLeader passed 6
// of 6 runs), and its tries have 2 s, not half a second: under -race on a
// host at load 6 a 500 ms try timed out 1 in 3 runs with the leader
// stable. The check that fails with the bug is
// TestReviewJSameLeaderLearnedAgainIsNoMove.
func TestReviewJShortCallsDoNotUnsettleTheLeader(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	cl := specDial(t, nodes) // election timeout 200 ms, as the cluster's
	ctx := testCtx(t, 60*time.Second)
	s := specSession(ctx, t, cl)
	rival := specSession(ctx, t, nodes[0])
	if _, err := rival.Acquire(ctx, "busy"); err != nil {
		t.Fatal(err)
	}
	term := nodes[specLeader(t, nodes)].Status().Term
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				cctx, cancel := context.WithTimeout(ctx, time.Millisecond)
				l, err := s.TryAcquire(cctx, fmt.Sprint("free", w))
				cancel()
				if err == nil {
					l.Release(ctx)
				}
			}
		}()
	}
	var failed []error
	pending := 0
	for range 20 {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		_, err := s.Acquire(cctx, "busy")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			failed = append(failed, fmt.Errorf("Acquire of a held lock: %w", err))
		}
		if errors.Is(err, quorumlock.ErrWithdrawPending) {
			pending++
		}
		cctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		_, err = s.TryAcquire(cctx, "busy")
		cancel()
		if !errors.Is(err, quorumlock.ErrLocked) {
			failed = append(failed, fmt.Errorf("TryAcquire of a held lock: %w", err))
		}
	}
	close(stop)
	wg.Wait()
	if now := nodes[specLeader(t, nodes)].Status().Term; now != term {
		t.Skipf("the cluster changed leader (term %d to %d): timeouts are then expected", term, now)
	}
	for _, err := range failed {
		t.Error(err)
	}
	// Not asserted (a 50 ms settling may not fit on a loaded machine),
	// but 0 of 20 is the norm with the leader stable; it was 5-10.
	t.Logf("%d of 20 Acquires with withdrawals pending", pending)
	if err := s.Err(); err != nil {
		t.Fatalf("session ended: %v", err)
	}
}

// Session.Close races calls of the session in flight (waiting Acquires of
// held locks, Acquire/TryAcquire/Release of free ones, a waiting Elect):
// every call ends soon with a definite outcome (a Lock whose Lost is
// closed by the time Close returns, or ErrSessionExpired), Close returns
// nil, and once it has returned the table shows the session neither
// holding nor queued anywhere, also after the holders release.
func TestReviewJCloseRacesCallsInFlight(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	for _, op := range specOpeners(t, nodes) {
		t.Run(op.name, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			rival := specSession(ctx, t, op.o)
			for _, name := range []string{"j0", "j1"} {
				if _, err := rival.Acquire(ctx, name); err != nil {
					t.Fatal(err)
				}
			}
			rl, err := rival.Elect(ctx, "jrole", nil)
			if err != nil {
				t.Fatal(err)
			}
			for round := range 3 {
				s, err := op.o.NewSession(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				var mu sync.Mutex
				var got []*quorumlock.Lock
				var bad []error
				ok := func(err error) bool {
					return err == nil || errors.Is(err, quorumlock.ErrSessionExpired) || errors.Is(err, quorumlock.ErrNotHeld)
				}
				// Waiting calls.
				for _, name := range []string{"j0", "j1", "j0"} {
					wg.Add(1)
					go func() {
						defer wg.Done()
						l, err := s.Acquire(ctx, name)
						mu.Lock()
						defer mu.Unlock()
						if err == nil {
							bad = append(bad, fmt.Errorf("Acquire(%q) of a lock the rival holds returned token %d", name, l.Token()))
						} else if !errors.Is(err, quorumlock.ErrSessionExpired) {
							bad = append(bad, fmt.Errorf("waiting Acquire(%q): %v", name, err))
						}
					}()
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := s.Elect(ctx, "jrole", nil)
					if !errors.Is(err, quorumlock.ErrSessionExpired) {
						mu.Lock()
						bad = append(bad, fmt.Errorf("waiting Elect: %v", err))
						mu.Unlock()
					}
				}()
				// Busy calls on free names.
				for w := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						name := []string{"j2", "j3"}[w%2]
						for s.Err() == nil {
							var l *quorumlock.Lock
							var err error
							if w < 2 {
								l, err = s.Acquire(ctx, name)
							} else {
								l, err = s.TryAcquire(ctx, name)
							}
							if !ok(err) && !errors.Is(err, quorumlock.ErrLocked) {
								mu.Lock()
								bad = append(bad, fmt.Errorf("acquire %q: %v", name, err))
								mu.Unlock()
								return
							}
							if l != nil {
								mu.Lock()
								got = append(got, l)
								mu.Unlock()
								if err := l.Release(ctx); !ok(err) {
									mu.Lock()
									bad = append(bad, fmt.Errorf("release %q: %v", name, err))
									mu.Unlock()
									return
								}
							}
						}
					}()
				}
				waitQueued(t, op.o, "j0", s.ID())
				waitQueued(t, op.o, "j1", s.ID())
				time.Sleep(time.Duration(round*7) * time.Millisecond)
				if err := s.Close(ctx); err != nil {
					t.Fatalf("Close: %v", err)
				}
				mu.Lock()
				for _, l := range got {
					if !closed(l.Lost()) {
						t.Errorf("%q token %d: Lost open after Close returned", l.Name(), l.Token())
					}
				}
				mu.Unlock()
				// The table, read right after Close returned.
				for _, name := range reviewJNames {
					info := holder(t, op.o, name)
					if info.Holder == s.ID() || slices.Contains(info.Waiters, s.ID()) {
						t.Errorf("%q after Close returned: %+v (session %d)", name, info, s.ID())
					}
				}
				if li, err := op.o.Leader(ctx, "jrole"); err != nil || li.Session != rival.ID() {
					t.Errorf("role after Close: %+v, %v", li, err)
				}
				done := make(chan struct{})
				go func() { wg.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(5 * time.Second):
					t.Fatal("calls of a closed session still running 5 s after Close")
				}
				for _, err := range bad {
					t.Error(err)
				}
				if len(s.Locks()) != 0 {
					t.Errorf("closed session lists locks: %v", s.Locks())
				}
			}
			// The rival hands over: nobody of the closed sessions is next.
			for _, l := range rival.Locks() {
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := rl.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			for _, name := range reviewJNames {
				if info := holder(t, op.o, name); info.Holder != 0 || len(info.Waiters) != 0 {
					t.Errorf("%q after every session closed or released: %+v", name, info)
				}
			}
			if _, err := op.o.Leader(ctx, "jrole"); !errors.Is(err, quorumlock.ErrNoLeader) {
				t.Errorf("role after the leader resigned and candidates closed: %v", err)
			}
		})
	}
}

// Every replica and a client close while calls of every kind are in
// flight through each (waiting Acquires, TryAcquire/Release loops, a
// waiting Elect, a leadership's Proclaims, Observe streams, Holder and
// NewSession loops): no call panics or outlives the close by more than a
// few seconds, each ends with ErrClosed or ErrSessionExpired (or a
// documented outcome from before the close), every session's Done and
// every Observe channel close, and no goroutine is left behind.
func TestReviewJCloseEverythingInFlight(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	nodes := specCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	cl, err := quorumlock.Dial(testCtx(t, 10*time.Second), specAddrs(nodes), quorumlock.WithElectionTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 60*time.Second)
	ops := []opener{nodes[0], nodes[1], nodes[2], cl}
	blocker, err := nodes[lead].NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Acquire(ctx, "held"); err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Elect(ctx, "role", nil); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []error
	report := func(format string, args ...any) {
		mu.Lock()
		bad = append(bad, fmt.Errorf(format, args...))
		mu.Unlock()
	}
	ended := func(err error) bool {
		return errors.Is(err, quorumlock.ErrClosed) || errors.Is(err, quorumlock.ErrSessionExpired)
	}
	var sessions []*quorumlock.Session
	var observers []<-chan quorumlock.LeaderInfo
	for i, o := range ops {
		s, err := o.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, s)
		ld, err := s.Elect(ctx, fmt.Sprint("own", i), nil)
		if err != nil {
			t.Fatal(err)
		}
		observers = append(observers, o.Observe(ctx, "role"), o.Observe(ctx, fmt.Sprint("own", i)))
		wg.Add(7)
		go func() { // a waiting Acquire
			defer wg.Done()
			if l, err := s.Acquire(ctx, "held"); !ended(err) {
				report("%s: waiting Acquire: %v, %v", where(o), l, err)
			}
		}()
		go func() { // a waiting Elect
			defer wg.Done()
			if _, err := s.Elect(ctx, "role", nil); !ended(err) {
				report("%s: waiting Elect: %v", where(o), err)
			}
		}()
		go func() { // an owned Elect waiting
			defer wg.Done()
			if _, err := o.Elect(ctx, "role", nil); !ended(err) {
				report("%s: waiting owned Elect: %v", where(o), err)
			}
		}()
		go func() { // Acquire/TryAcquire/Release
			defer wg.Done()
			for n := 0; ; n++ {
				name := fmt.Sprint("free", i)
				var l *quorumlock.Lock
				var err error
				if n%2 == 0 {
					l, err = s.Acquire(ctx, name)
				} else {
					l, err = s.TryAcquire(ctx, name)
				}
				if err != nil {
					if !ended(err) {
						report("%s: acquire: %v", where(o), err)
					}
					return
				}
				if err := l.Release(ctx); err != nil {
					if !ended(err) {
						report("%s: release: %v", where(o), err)
					}
					return
				}
			}
		}()
		go func() { // Proclaims
			defer wg.Done()
			for {
				if err := ld.Proclaim(ctx, []byte("v")); err != nil {
					if !ended(err) {
						report("%s: Proclaim: %v", where(o), err)
					}
					return
				}
			}
		}()
		go func() { // reads
			defer wg.Done()
			for {
				if _, err := o.Holder(ctx, "held"); err != nil {
					if !errors.Is(err, quorumlock.ErrClosed) {
						report("%s: Holder: %v", where(o), err)
					}
					return
				}
			}
		}()
		go func() { // sessions opened and closed
			defer wg.Done()
			for {
				ns, err := o.NewSession(ctx)
				if err != nil {
					if !errors.Is(err, quorumlock.ErrClosed) {
						report("%s: NewSession: %v", where(o), err)
					}
					return
				}
				if err := ns.Close(ctx); err != nil && !ended(err) {
					report("%s: Session.Close: %v", where(o), err)
					return
				}
			}
		}()
	}
	for _, o := range ops {
		if n, ok := o.(*quorumlock.Node); ok {
			waitQueued(t, n, "held", sessions[0].ID())
			break
		}
	}
	time.Sleep(100 * time.Millisecond)
	var closers sync.WaitGroup
	for _, n := range nodes {
		closers.Go(func() { n.Close() })
	}
	closers.Go(func() { cl.Close() })
	all := make(chan struct{})
	go func() { closers.Wait(); wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(20 * time.Second):
		t.Fatal("calls or Close still running 20 s after every replica and the client closed")
	}
	for _, err := range bad {
		t.Error(err)
	}
	for _, s := range append(sessions, blocker) {
		if !closed(s.Done()) {
			t.Errorf("session %d alive after its replica or client closed", s.ID())
		}
	}
	for i, ch := range observers {
		if !observeEnds(ch, 5*time.Second) {
			t.Errorf("Observe stream %d still open after close", i)
		}
	}
	goleak.VerifyNone(t, ignore)
}

// Two concurrent Releases of one grant: one frees it (nil), the other
// finds it gone (ErrNotHeld); both leave Lost closed and the session's
// Locks without it, and the next waiter is granted with a larger token.
// A Release racing an Acquire of the same name by the same session
// (which returns the held grant) leaves the session's view and the table
// agreeing. Release after Session.Close returns ErrSessionExpired and
// changes nothing.
func TestReviewJConcurrentReleases(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	for _, op := range specOpeners(t, nodes) {
		t.Run(op.name, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			s := specSession(ctx, t, op.o)
			waiter := specSession(ctx, t, op.o)
			for round := range 10 {
				l, err := s.Acquire(ctx, "j0")
				if err != nil {
					t.Fatal(err)
				}
				wait := acquireQueued(t, ctx, waiter, op.o, "j0")
				errs := make(chan error, 2)
				for range 2 {
					go func() { errs <- l.Release(ctx) }()
				}
				var nils, notHeld int
				for range 2 {
					switch err := <-errs; {
					case err == nil:
						nils++
					case errors.Is(err, quorumlock.ErrNotHeld):
						notHeld++
					default:
						t.Fatalf("round %d: concurrent Release: %v", round, err)
					}
				}
				if nils != 1 || notHeld != 1 {
					t.Fatalf("round %d: concurrent Releases: %d nil, %d ErrNotHeld; want one each", round, nils, notHeld)
				}
				if !closed(l.Lost()) || len(s.Locks()) != 0 {
					t.Fatalf("round %d: after Release: Lost closed %v, Locks %v", round, closed(l.Lost()), s.Locks())
				}
				r := <-wait
				if r.err != nil || r.l.Token() <= l.Token() {
					t.Fatalf("round %d: waiter: %v, %v (released token %d)", round, r.l, r.err, l.Token())
				}
				if err := r.l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// Release racing a re-entrant Acquire of the same session.
			var got []*quorumlock.Lock
			for range 20 {
				l, err := s.Acquire(ctx, "j1")
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, l)
				rel := make(chan error, 1)
				go func() { rel <- l.Release(ctx) }()
				l2, err := s.Acquire(ctx, "j1")
				switch {
				case err == nil:
					got = append(got, l2)
				case errors.Is(err, quorumlock.ErrNotHeld):
				default:
					t.Fatalf("Acquire racing Release: %v", err)
				}
				if err := <-rel; err != nil {
					t.Fatalf("Release racing Acquire: %v", err)
				}
				reviewJCheckTable(t, op.o, s, got)
				for _, l := range s.Locks() {
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			// Release after Close.
			l, err := s.Acquire(ctx, "j2")
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); !errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Fatalf("Release after Close: %v", err)
			}
			if _, err := s.Acquire(ctx, "j2"); !errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Fatalf("Acquire after Close: %v", err)
			}
			if info := holder(t, op.o, "j2"); info.Holder != 0 {
				t.Fatalf("j2 after Close: %+v", info)
			}
		})
	}
}

// Leadership under concurrent use: Proclaims racing Resign each end with
// nil or ErrNotHeld and none changes the value once the next leader is
// elected; two concurrent Resigns give one nil and one ErrNotHeld (nil
// twice for Node.Elect's, whose Resign is Session.Close); Done and
// Context end by the time Resign returns; two sessions of one process
// campaign for one role, and the second leads only after the first
// resigned, with a larger epoch, as Observe reports in order.
func TestReviewJLeadershipRaces(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	admin := specDial(t, nodes)
	for _, op := range specOpeners(t, nodes) {
		t.Run(op.name, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			a := specSession(ctx, t, op.o)
			b := specSession(ctx, t, op.o)
			octx, ocancel := context.WithCancel(ctx)
			events := op.o.Observe(octx, "jr")
			var lastEpoch quorumlock.Token
			for round := range 6 {
				la, err := a.Elect(ctx, "jr", []byte("a"))
				if err != nil {
					t.Fatal(err)
				}
				if la.Epoch() <= lastEpoch {
					t.Fatalf("round %d: epoch %d after %d", round, la.Epoch(), lastEpoch)
				}
				bc := make(chan *quorumlock.Leadership, 1)
				go func() {
					lb, err := b.Elect(ctx, "jr", []byte("b"))
					if err != nil {
						t.Errorf("round %d: second candidate: %v", round, err)
					}
					bc <- lb
				}()
				reviewJWaitCandidate(t, admin, "jr", b.ID())
				var wg sync.WaitGroup
				for i := range 4 {
					wg.Go(func() {
						err := la.Proclaim(ctx, []byte(fmt.Sprint("p", i)))
						if err != nil && !errors.Is(err, quorumlock.ErrNotHeld) {
							t.Errorf("round %d: Proclaim racing Resign: %v", round, err)
						}
					})
				}
				resigns := make(chan error, 2)
				for range 2 {
					go func() { resigns <- la.Resign(ctx) }()
				}
				var nils, notHeld int
				for range 2 {
					switch err := <-resigns; {
					case err == nil:
						nils++
					case errors.Is(err, quorumlock.ErrNotHeld):
						notHeld++
					default:
						t.Fatalf("round %d: concurrent Resign: %v", round, err)
					}
					if !closed(la.Done()) || la.Context().Err() == nil {
						t.Fatalf("round %d: Resign returned with Done open", round)
					}
				}
				if nils != 1 || notHeld != 1 {
					t.Fatalf("round %d: concurrent Resigns: %d nil, %d ErrNotHeld", round, nils, notHeld)
				}
				wg.Wait()
				lb := <-bc
				if lb == nil {
					t.FailNow()
				}
				if lb.Epoch() <= la.Epoch() {
					t.Fatalf("round %d: second leader's epoch %d after %d", round, lb.Epoch(), la.Epoch())
				}
				li, err := op.o.Leader(ctx, "jr")
				if err != nil || li.Session != b.ID() || li.Epoch != lb.Epoch() || string(li.Value) != "b" {
					t.Fatalf("round %d: leader after hand-over: %+v, %v (a Proclaim of the old leader changed it?)", round, li, err)
				}
				if err := la.Proclaim(ctx, []byte("late")); !errors.Is(err, quorumlock.ErrNotHeld) {
					t.Fatalf("round %d: Proclaim after Resign: %v", round, err)
				}
				if err := lb.Resign(ctx); err != nil {
					t.Fatal(err)
				}
				lastEpoch = lb.Epoch()
			}
			// Observe: epochs never go back, "no leader" between leaders.
			var prev quorumlock.LeaderInfo
			first := true
			for {
				var ev quorumlock.LeaderInfo
				select {
				case ev = <-events:
				case <-time.After(5 * time.Second):
					t.Fatal("Observe did not reach the last resignation")
				}
				if ev.Epoch < prev.Epoch {
					t.Fatalf("Observe went back: %+v after %+v", ev, prev)
				}
				if !first && ev.HasLeader() && prev.HasLeader() && ev.Epoch != prev.Epoch {
					t.Fatalf("Observe: leader %+v right after leader %+v without a no-leader event", ev, prev)
				}
				prev, first = ev, false
				if !ev.HasLeader() && ev.Epoch == lastEpoch {
					break
				}
			}
			ocancel()
			for range events {
			}

			// Node.Elect's (or Client.Elect's) leadership: two Resigns
			// give nil twice.
			lo, err := op.o.Elect(ctx, "jo", nil)
			if err != nil {
				t.Fatal(err)
			}
			r1, r2 := make(chan error, 1), make(chan error, 1)
			go func() { r1 <- lo.Resign(ctx) }()
			go func() { r2 <- lo.Resign(ctx) }()
			if e1, e2 := <-r1, <-r2; e1 != nil || e2 != nil {
				t.Fatalf("concurrent Resigns of an owned leadership: %v, %v", e1, e2)
			}
			if _, err := op.o.Leader(ctx, "jo"); !errors.Is(err, quorumlock.ErrNoLeader) {
				t.Fatalf("owned role after Resign: %v", err)
			}
		})
	}
}

// reviewJWaitCandidate waits until session is among the candidates of
// role, as Client.Locks lists them.
func reviewJWaitCandidate(t *testing.T, admin *quorumlock.Client, role string, session uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		entries, _, err := admin.Locks(testCtx(t, 10*time.Second), "", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Role && e.Name == role && slices.Contains(e.Waiters, session) {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("session %d never a candidate for %q", session, role)
}

// reviewJNoPanic runs f and reports a panic as a test error.
func reviewJNoPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%s panicked: %v", what, r)
		}
	}()
	f()
}

// The nil a failed call returns (a *Lock, *Session or *Leadership), a
// zero Lock, Session or Leadership, and a nil ctx are misuse the API
// answers with errors, not panics: Release, Resign and Proclaim of no
// grant return ErrNotHeld, calls of no session ErrSessionExpired, Done and
// Lost are closed (nothing is held through them), and a nil ctx is taken
// as context.Background() by every call that takes a ctx, on a replica
// and through a client.
func TestReviewJNilAndZeroValues(t *testing.T) {
	nodes := specCluster(t, 1, nil)
	n := nodes[0]
	specLeader(t, nodes)
	cl := specDial(t, nodes)
	ctx := testCtx(t, 20*time.Second)
	var nilCtx context.Context
	for _, l := range []*quorumlock.Lock{nil, new(quorumlock.Lock)} {
		reviewJNoPanic(t, "Lock methods", func() {
			if err := l.Release(ctx); !errors.Is(err, quorumlock.ErrNotHeld) {
				t.Errorf("Release of a nil or zero Lock: %v", err)
			}
			if !closed(l.Lost()) || l.Token() != 0 || l.Name() != "" || l.Session() != nil {
				t.Errorf("nil or zero Lock: Lost closed %v, token %d, name %q", closed(l.Lost()), l.Token(), l.Name())
			}
		})
	}
	for _, s := range []*quorumlock.Session{nil, new(quorumlock.Session)} {
		reviewJNoPanic(t, "Session methods", func() {
			if _, err := s.Acquire(ctx, "a"); !errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Errorf("Acquire on a nil or zero Session: %v", err)
			}
			if _, err := s.TryAcquire(ctx, "a"); !errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Errorf("TryAcquire on a nil or zero Session: %v", err)
			}
			if _, err := s.Elect(ctx, "r", nil); !errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Errorf("Elect on a nil or zero Session: %v", err)
			}
			if err := s.Close(ctx); !errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Errorf("Close of a nil or zero Session: %v", err)
			}
			if !errors.Is(s.Err(), quorumlock.ErrSessionExpired) || !closed(s.Done()) || s.ID() != 0 || len(s.Locks()) != 0 || !s.Deadline().IsZero() || s.TTL() != 0 {
				t.Errorf("nil or zero Session: Err %v, Done closed %v, ID %d", s.Err(), closed(s.Done()), s.ID())
			}
		})
	}
	for _, ld := range []*quorumlock.Leadership{nil, new(quorumlock.Leadership)} {
		reviewJNoPanic(t, "Leadership methods", func() {
			if err := ld.Resign(ctx); !errors.Is(err, quorumlock.ErrNotHeld) {
				t.Errorf("Resign of a nil or zero Leadership: %v", err)
			}
			if err := ld.Proclaim(ctx, nil); !errors.Is(err, quorumlock.ErrNotHeld) {
				t.Errorf("Proclaim of a nil or zero Leadership: %v", err)
			}
			if !closed(ld.Done()) || ld.Context().Err() == nil || ld.Epoch() != 0 || ld.Role() != "" || ld.Session() != nil {
				t.Errorf("nil or zero Leadership: Done closed %v, Context %v, epoch %d", closed(ld.Done()), ld.Context().Err(), ld.Epoch())
			}
		})
	}
	// A nil ctx, on a replica and through a client.
	reviewJNoPanic(t, "Dial with a nil ctx", func() {
		c, err := quorumlock.Dial(nilCtx, specAddrs(nodes))
		if err != nil {
			t.Errorf("Dial with a nil ctx: %v", err)
			return
		}
		c.Close()
	})
	reviewJNoPanic(t, "Start with a nil ctx", func() {
		if _, err := quorumlock.Start(nilCtx, quorumlock.Config{}); !errors.Is(err, quorumlock.ErrInvalidConfig) {
			t.Errorf("Start with a nil ctx and an empty Config: %v", err)
		}
	})
	for _, o := range []opener{n, cl} {
		reviewJNoPanic(t, where(o)+" with a nil ctx", func() {
			s, err := o.NewSession(nilCtx)
			if err != nil {
				t.Fatalf("NewSession(nil ctx) on %s: %v", where(o), err)
			}
			l, err := s.Acquire(nilCtx, "a")
			if err != nil {
				t.Fatalf("Acquire(nil ctx): %v", err)
			}
			if _, err := s.TryAcquire(nilCtx, "b"); err != nil {
				t.Errorf("TryAcquire(nil ctx): %v", err)
			}
			if info, err := o.Holder(nilCtx, "a"); err != nil || info.Holder != s.ID() {
				t.Errorf("Holder(nil ctx): %+v, %v", info, err)
			}
			if err := l.Release(nilCtx); err != nil {
				t.Errorf("Release(nil ctx): %v", err)
			}
			ld, err := s.Elect(nilCtx, "r", nil)
			if err != nil {
				t.Fatalf("Session.Elect(nil ctx): %v", err)
			}
			if err := ld.Proclaim(nilCtx, []byte("v")); err != nil {
				t.Errorf("Proclaim(nil ctx): %v", err)
			}
			if li, err := o.Leader(nilCtx, "r"); err != nil || li.Epoch != ld.Epoch() {
				t.Errorf("Leader(nil ctx): %+v, %v", li, err)
			}
			events := o.Observe(nilCtx, "r")
			if ev := <-events; ev.Epoch != ld.Epoch() {
				t.Errorf("Observe(nil ctx) first event: %+v", ev)
			}
			if err := ld.Resign(nilCtx); err != nil {
				t.Errorf("Resign(nil ctx): %v", err)
			}
			owned, err := o.Elect(nilCtx, "r2", nil)
			if err != nil {
				t.Fatalf("Elect(nil ctx): %v", err)
			}
			if err := owned.Resign(nilCtx); err != nil {
				t.Errorf("owned Resign(nil ctx): %v", err)
			}
			if err := s.Close(nilCtx); err != nil {
				t.Errorf("Close(nil ctx): %v", err)
			}
		})
	}
	reviewJNoPanic(t, "Client admin calls with a nil ctx", func() {
		if st := cl.Status(nilCtx); len(st) != 1 || st[0].Err != nil {
			t.Errorf("Status(nil ctx): %+v", st)
		}
		if _, _, err := cl.Locks(nilCtx, "", 0); err != nil {
			t.Errorf("Locks(nil ctx): %v", err)
		}
		if _, _, err := cl.Sessions(nilCtx, 0, 0); err != nil {
			t.Errorf("Sessions(nil ctx): %v", err)
		}
		if err := cl.RevokeSession(nilCtx, 1<<40); !errors.Is(err, quorumlock.ErrSessionExpired) {
			t.Errorf("RevokeSession(nil ctx) of no session: %v", err)
		}
	})
	// After the Node and the Client closed, a nil ctx gives ErrClosed.
	cl.Close()
	n.Close()
	reviewJNoPanic(t, "calls with a nil ctx after Close", func() {
		for _, o := range []opener{n, cl} {
			if _, err := o.NewSession(nilCtx); !errors.Is(err, quorumlock.ErrClosed) {
				t.Errorf("NewSession(nil ctx) on closed %s: %v", where(o), err)
			}
			if _, err := o.Holder(nilCtx, "a"); !errors.Is(err, quorumlock.ErrClosed) {
				t.Errorf("Holder(nil ctx) on closed %s: %v", where(o), err)
			}
			if _, ok := <-o.Observe(nilCtx, "r"); ok {
				t.Errorf("Observe(nil ctx) on closed %s delivered an event", where(o))
			}
		}
	})
}

// Limits under concurrency: sessions opened at once past MaxSessions,
// acquires of one session at once past MaxLocksPerSession, and waiters at
// once past MaxWaitersPerLock: exactly the limit succeeds, the rest get
// ErrLimit (nothing else), and the table shows exactly the successes.
// Names of exactly MaxNameBytes (ending in a multi-byte rune) work, one
// byte more is ErrInvalidName, on a replica and through a client (which
// does not know the cluster's MaxNameBytes).
func TestReviewJLimitsUnderConcurrency(t *testing.T) {
	const maxName = 16
	nodes := specCluster(t, 3, func(c *quorumlock.Config) {
		c.MaxSessions = 12
		c.MaxLocksPerSession = 3
		c.MaxWaitersPerLock = 2
		c.MaxNameBytes = maxName
	})
	ops := specOpeners(t, nodes)
	ctx := testCtx(t, 30*time.Second)
	// Sessions.
	var mu sync.Mutex
	var sessions []*quorumlock.Session
	var limited int
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			s, err := ops[i%2].o.NewSession(ctx)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				sessions = append(sessions, s)
			case errors.Is(err, quorumlock.ErrLimit):
				limited++
			default:
				t.Errorf("NewSession: %v", err)
			}
		})
	}
	wg.Wait()
	if len(sessions) != 12 || limited != 8 {
		t.Fatalf("20 sessions at once, limit 12: %d opened, %d ErrLimit", len(sessions), limited)
	}
	t.Cleanup(func() {
		for _, s := range sessions {
			s.Close(testCtx(t, 10*time.Second))
		}
	})
	// Locks per session: 6 names at once on one session, limit 3.
	for k, op := range ops {
		s := sessions[k]
		var got []*quorumlock.Lock
		limited := 0
		for i := range 6 {
			wg.Go(func() {
				var l *quorumlock.Lock
				var err error
				if i%2 == 0 {
					l, err = s.Acquire(ctx, fmt.Sprintf("k%d-%d", k, i))
				} else {
					l, err = s.TryAcquire(ctx, fmt.Sprintf("k%d-%d", k, i))
				}
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					got = append(got, l)
				case errors.Is(err, quorumlock.ErrLimit):
					limited++
				default:
					t.Errorf("%s: acquire: %v", op.name, err)
				}
			})
		}
		wg.Wait()
		if len(got) != 3 || limited != 3 || len(s.Locks()) != 3 {
			t.Fatalf("%s: 6 locks at once, limit 3: %d granted, %d ErrLimit, Locks %d", op.name, len(got), limited, len(s.Locks()))
		}
		for i := range 6 {
			name := fmt.Sprintf("k%d-%d", k, i)
			info := holder(t, op.o, name)
			held := slices.ContainsFunc(got, func(l *quorumlock.Lock) bool { return l.Name() == name })
			if held != (info.Holder == s.ID()) || (!held && (info.Holder != 0 || len(info.Waiters) != 0)) {
				t.Fatalf("%s: %q: granted %v, table %+v", op.name, name, held, info)
			}
		}
	}
	// Waiters per lock: sessions 2..9 wait at once for a lock session 0
	// holds, limit 2.
	busy := sessions[0].Locks()[0].Name()
	wctx, wcancel := context.WithCancel(ctx)
	type res struct {
		s   *quorumlock.Session
		err error
	}
	results := make(chan res, 8)
	for _, s := range sessions[2:10] {
		go func() {
			_, err := s.Acquire(wctx, busy)
			results <- res{s, err}
		}()
	}
	var refused []res
	for range 6 {
		select {
		case r := <-results:
			if !errors.Is(r.err, quorumlock.ErrLimit) {
				t.Fatalf("waiter past the limit: %v", r.err)
			}
			refused = append(refused, r)
		case <-time.After(10 * time.Second):
			t.Fatal("fewer than 6 waiters refused")
		}
	}
	info := holder(t, ops[0].o, busy)
	if len(info.Waiters) != 2 || info.Holder != sessions[0].ID() {
		t.Fatalf("%q with 2 waiters allowed: %+v", busy, info)
	}
	for _, r := range refused {
		if slices.Contains(info.Waiters, r.s.ID()) {
			t.Fatalf("refused session %d queued: %+v", r.s.ID(), info)
		}
	}
	wcancel()
	for range 2 {
		if r := <-results; !errors.Is(r.err, context.Canceled) || errors.Is(r.err, quorumlock.ErrWithdrawPending) {
			t.Fatalf("cancelled waiter: %v", r.err)
		}
	}
	if info := holder(t, ops[0].o, busy); len(info.Waiters) != 0 {
		t.Fatalf("waiters left after cancelling: %+v", info)
	}
	// Names at the bound.
	exact := strings.Repeat("a", maxName-3) + "€" // 3-byte rune at the end
	over := strings.Repeat("a", maxName-2) + "€"
	for k, op := range ops {
		s := sessions[10+k]
		l, err := s.TryAcquire(ctx, exact)
		if err != nil {
			t.Fatalf("%s: a name of exactly MaxNameBytes: %v", op.name, err)
		}
		if info := holder(t, op.o, exact); info.Holder != s.ID() || info.Token != l.Token() {
			t.Fatalf("%s: Holder of the exact name: %+v", op.name, info)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		ld, err := s.Elect(ctx, exact, nil)
		if err != nil {
			t.Fatalf("%s: a role of exactly MaxNameBytes: %v", op.name, err)
		}
		if li, err := op.o.Leader(ctx, exact); err != nil || li.Epoch != ld.Epoch() {
			t.Fatalf("%s: Leader of the exact role: %+v, %v", op.name, li, err)
		}
		if err := ld.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(ctx, over); !errors.Is(err, quorumlock.ErrInvalidName) {
			t.Fatalf("%s: a name one byte over: %v", op.name, err)
		}
		if _, err := s.Elect(ctx, over, nil); !errors.Is(err, quorumlock.ErrInvalidName) {
			t.Fatalf("%s: a role one byte over: %v", op.name, err)
		}
		if _, err := op.o.Holder(ctx, over); !errors.Is(err, quorumlock.ErrInvalidName) {
			t.Fatalf("%s: Holder of a name one byte over: %v", op.name, err)
		}
		if s.Err() != nil {
			t.Fatalf("%s: session ended by bad names: %v", op.name, s.Err())
		}
	}
}

// Calls with a ctx that has already ended: Acquire and TryAcquire return
// ctx's error and leave nothing held or queued; Release returns
// ErrUnknownOutcome and keeps the Lock listed until a Release with a live
// ctx settles it; Session.Close returns ErrUnknownOutcome, ends the
// session at once and frees its locks in the background well before its
// TTL; Observe's channel closes at once.
func TestReviewJEndedContext(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	for _, op := range specOpeners(t, nodes) {
		t.Run(op.name, func(t *testing.T) {
			ctx := testCtx(t, 30*time.Second)
			gone, cancel := context.WithCancel(ctx)
			cancel()
			s := specSession(ctx, t, op.o, quorumlock.WithTTL(time.Minute))
			other := specSession(ctx, t, op.o)
			if _, err := other.Acquire(ctx, "j1"); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"j0", "j1"} {
				if _, err := s.Acquire(gone, name); !errors.Is(err, context.Canceled) {
					t.Fatalf("Acquire(%q) with an ended ctx: %v", name, err)
				}
				if _, err := s.TryAcquire(gone, name); !errors.Is(err, context.Canceled) {
					t.Fatalf("TryAcquire(%q) with an ended ctx: %v", name, err)
				}
				if info := holder(t, op.o, name); info.Holder == s.ID() || slices.Contains(info.Waiters, s.ID()) {
					t.Fatalf("%q after calls with an ended ctx: %+v", name, info)
				}
			}
			if len(s.Locks()) != 0 {
				t.Fatalf("Locks after calls with an ended ctx: %v", s.Locks())
			}
			l, err := s.Acquire(ctx, "j0")
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(gone); !errors.Is(err, quorumlock.ErrUnknownOutcome) || !errors.Is(err, context.Canceled) {
				t.Fatalf("Release with an ended ctx: %v", err)
			}
			if err := l.Release(ctx); err != nil && !errors.Is(err, quorumlock.ErrNotHeld) {
				t.Fatalf("Release settling an unknown outcome: %v", err)
			}
			if info := holder(t, op.o, "j0"); info.Holder != 0 || !closed(l.Lost()) || len(s.Locks()) != 0 {
				t.Fatalf("after settling the release: %+v, Lost closed %v, Locks %v", info, closed(l.Lost()), s.Locks())
			}
			if ch := op.o.Observe(gone, "r"); !observeEnds(ch, 5*time.Second) {
				t.Fatal("Observe with an ended ctx stayed open")
			}
			// Close with an ended ctx: the session (TTL 1 min) frees its
			// lock in the background, not a minute later.
			l, err = s.Acquire(ctx, "j0")
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Close(gone); !errors.Is(err, quorumlock.ErrUnknownOutcome) {
				t.Fatalf("Close with an ended ctx: %v", err)
			}
			if !closed(s.Done()) || !closed(l.Lost()) {
				t.Fatal("Close with an ended ctx left the session or its lock alive locally")
			}
			deadline := time.Now().Add(10 * time.Second)
			for holder(t, op.o, "j0").Holder == s.ID() {
				if time.Now().After(deadline) {
					t.Fatal("a session closed with an ended ctx still holds its lock 10 s later")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := s.Close(ctx); err != nil && !errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Fatalf("second Close: %v", err)
			}
		})
	}
}

// WithTTL at its bounds: exactly MinSessionTTL and MaxSessionTTL open
// sessions with that TTL (as the cluster lists it too), anything outside
// (including 0 and negative) is ErrInvalidTTL and opens nothing.
func TestReviewJWithTTLBounds(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	admin := specDial(t, nodes)
	ctx := testCtx(t, 30*time.Second)
	count := func() int {
		list, _, err := admin.Sessions(ctx, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(list)
	}
	for _, op := range specOpeners(t, nodes) {
		for _, ttl := range []time.Duration{quorumlock.MinSessionTTL, quorumlock.MaxSessionTTL} {
			s := specSession(ctx, t, op.o, quorumlock.WithTTL(ttl))
			if s.TTL() != ttl {
				t.Fatalf("%s: WithTTL(%v): TTL %v", op.name, ttl, s.TTL())
			}
			list, _, err := admin.Sessions(ctx, s.ID()-1, 1)
			if err != nil || len(list) != 1 || list[0].ID != s.ID() || list[0].TTL != ttl {
				t.Fatalf("%s: WithTTL(%v): the cluster lists %+v, %v", op.name, ttl, list, err)
			}
		}
		// The cluster keeps TTLs in whole milliseconds: the session's
		// own TTL (its lease) is the same truncated value.
		odd := 2*time.Second + 500*time.Microsecond
		s := specSession(ctx, t, op.o, quorumlock.WithTTL(odd))
		if list, _, err := admin.Sessions(ctx, s.ID()-1, 1); err != nil || len(list) != 1 || list[0].TTL != 2*time.Second || s.TTL() != list[0].TTL {
			t.Fatalf("%s: WithTTL(%v): TTL %v, the cluster lists %+v, %v; want both 2s", op.name, odd, s.TTL(), list, err)
		}
		before := count()
		for _, ttl := range []time.Duration{0, -time.Second, quorumlock.MinSessionTTL - time.Nanosecond, quorumlock.MaxSessionTTL + time.Nanosecond} {
			if s, err := op.o.NewSession(ctx, quorumlock.WithTTL(ttl)); !errors.Is(err, quorumlock.ErrInvalidTTL) || s != nil {
				t.Fatalf("%s: WithTTL(%v): %v, %v", op.name, ttl, s, err)
			}
		}
		if after := count(); after != before {
			t.Fatalf("%s: refused TTLs opened sessions: %d, then %d", op.name, before, after)
		}
	}
}

// Session.Elect racing Resign of the session's own leadership of the
// role, while another session waits as candidate: Elect answered with the
// grant being resigned used to hand it out again as a new Leadership,
// whose Done closed only when the release was answered, after the waiting
// candidate could be elected: two leaderships open in the client's view.
// Now Elect returns ErrNotHeld for a grant a Resign in flight gives up
// (or a new grant, or the leadership itself if it came first), and no
// candidate is elected while a leadership of the role is open.
func TestReviewJElectRacesResign(t *testing.T) {
	t.Parallel()
	nodes := specCluster(t, 3, nil)
	for _, op := range specOpeners(t, nodes) {
		t.Run(op.name, func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			a := specSession(ctx, t, op.o)
			b := specSession(ctx, t, op.o)
			for round := range 40 {
				ld, err := a.Elect(ctx, "jx", nil)
				if err != nil {
					t.Fatal(err)
				}
				var mu sync.Mutex
				var open []*quorumlock.Leadership // a's leaderships of ld's grant
				bdone := make(chan struct{})
				go func() {
					defer close(bdone)
					lb, err := b.Elect(ctx, "jx", nil)
					if err != nil {
						t.Errorf("round %d: candidate: %v", round, err)
						return
					}
					mu.Lock()
					for _, l := range open {
						if !closed(l.Done()) {
							t.Errorf("round %d: session %d elected (epoch %d) while a leadership of epoch %d is open", round, b.ID(), lb.Epoch(), l.Epoch())
						}
					}
					mu.Unlock()
					lb.Resign(ctx)
				}()
				reviewJWaitCandidate(t, reviewJAdmin(t, nodes), "jx", b.ID())
				rdone := make(chan error, 1)
				go func() { rdone <- ld.Resign(ctx) }()
				ld2, err := a.Elect(ctx, "jx", nil)
				switch {
				case err == nil && ld2.Epoch() == ld.Epoch():
					mu.Lock()
					open = append(open, ld2)
					mu.Unlock()
				case err == nil, errors.Is(err, quorumlock.ErrNotHeld):
				default:
					t.Fatalf("round %d: Elect racing Resign: %v", round, err)
				}
				if err := <-rdone; err != nil {
					t.Fatalf("round %d: Resign: %v", round, err)
				}
				<-bdone
				if err == nil {
					ld2.Resign(ctx)
				}
			}
		})
	}
}

var reviewJAdminClients sync.Map // *testing.T -> *quorumlock.Client

// reviewJAdmin returns a client of nodes for Client.Locks, one per test.
func reviewJAdmin(t *testing.T, nodes []*quorumlock.Node) *quorumlock.Client {
	if c, ok := reviewJAdminClients.Load(t); ok {
		return c.(*quorumlock.Client)
	}
	c := specDial(t, nodes)
	reviewJAdminClients.Store(t, c)
	t.Cleanup(func() { reviewJAdminClients.Delete(t) })
	return c
}
