package quorumlock_test

// Black-box tests of the remote client (issue 5), written from the issue,
// the README and the docstrings only: ordinary use of Start, Dial and the
// Session/Lock/Leadership API. Every test is bounded in time.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/clock"
)

const (
	rbTick = 20 * time.Millisecond
	rbET   = 10 * rbTick // election timeout of rbCluster
	rbTTL  = 3 * time.Second
)

// rbCluster starts size replicas with specCluster, with the session TTL
// rbTTL.
func rbCluster(t *testing.T, size int, mutate func(*quorumlock.Config)) []*quorumlock.Node {
	t.Helper()
	return specCluster(t, size, func(c *quorumlock.Config) {
		c.SessionTTL = rbTTL
		if mutate != nil {
			mutate(c)
		}
	})
}

// rbDial dials addrs with the session TTL and election timeout of
// rbCluster.
func rbDial(t *testing.T, addrs []string, opts ...quorumlock.ClientOption) *quorumlock.Client {
	t.Helper()
	return dial(t, addrs, append([]quorumlock.ClientOption{quorumlock.WithSessionTTL(rbTTL), quorumlock.WithElectionTimeout(rbET)}, opts...)...)
}

// rbKind names the sentinel err wraps (the first that matches), so that
// the errors of a replica's session and a client's can be compared.
func rbKind(err error) string {
	if err == nil {
		return "nil"
	}
	for _, s := range []struct {
		name string
		err  error
	}{
		{"ErrUnknownOutcome", quorumlock.ErrUnknownOutcome},
		{"ErrClosed", quorumlock.ErrClosed},
		{"ErrInvalidName", quorumlock.ErrInvalidName},
		{"ErrInvalidTTL", quorumlock.ErrInvalidTTL},
		{"ErrLimit", quorumlock.ErrLimit},
		{"ErrLocked", quorumlock.ErrLocked},
		{"ErrNotHeld", quorumlock.ErrNotHeld},
		{"ErrNoLeader", quorumlock.ErrNoLeader},
		{"ErrSessionExpired", quorumlock.ErrSessionExpired},
		{"ErrInvalidConfig", quorumlock.ErrInvalidConfig},
		{"DeadlineExceeded", context.DeadlineExceeded},
		{"Canceled", context.Canceled},
	} {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	return "other: " + err.Error()
}

// rbLeaderFirst starts a three-replica rbCluster (mutate as there), waits
// for its leader and dials a client that talks to the leader first.
func rbLeaderFirst(t *testing.T, mutate func(*quorumlock.Config)) (nodes []*quorumlock.Node, lead int, cl *quorumlock.Client) {
	t.Helper()
	nodes = rbCluster(t, 3, mutate)
	lead = specLeader(t, nodes)
	cl = rbDial(t, specAddrs(nodes, lead, (lead+1)%3, (lead+2)%3))
	return nodes, lead, cl
}

// rbWait polls cond until it holds or d passes.
func rbWait(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rbBadInputs runs the same bad inputs through o and returns, per case,
// which sentinel came back. admin revokes a session (the client's
// RevokeSession, as lockctl revoke-session does).
func rbBadInputs(t *testing.T, o opener, prefix string, admin func(context.Context, uint64) error) map[string]string {
	ctx := testCtx(t, 60*time.Second)
	got := map[string]string{}
	put := func(name string, err error) { got[name] = rbKind(err) }

	_, err := o.NewSession(ctx, quorumlock.WithTTL(quorumlock.MinSessionTTL-time.Millisecond))
	put("NewSession ttl below min", err)
	_, err = o.NewSession(ctx, quorumlock.WithTTL(quorumlock.MaxSessionTTL+time.Millisecond))
	put("NewSession ttl above max", err)
	_, err = o.NewSession(ctx, quorumlock.WithTTL(-time.Second))
	put("NewSession negative ttl", err)
	s, err := o.NewSession(ctx, nil, quorumlock.WithTTL(rbTTL))
	if err != nil {
		t.Fatalf("%s: NewSession: %v", prefix, err)
	}
	other := newSession(t, o)
	third, err := o.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Names: the cluster's MaxNameBytes is 16.
	names := map[string]string{
		"empty": "", "nul": "a\x00b", "not utf8": "a\xffb", "17 bytes": strings.Repeat("n", 17),
		"huge": strings.Repeat("n", quorumlock.MaxNameBytesLimit+1),
	}
	for label, name := range names {
		_, err := s.Acquire(ctx, name)
		put("Acquire name "+label, err)
		_, err = s.TryAcquire(ctx, name)
		put("TryAcquire name "+label, err)
		_, err = o.Holder(ctx, name)
		put("Holder name "+label, err)
		_, err = o.Leader(ctx, name)
		put("Leader name "+label, err)
		_, err = s.Elect(ctx, name, nil)
		put("Session.Elect role "+label, err)
		_, err = o.Elect(ctx, name, nil)
		put("Elect role "+label, err)
		ch := o.Observe(ctx, name)
		select {
		case _, ok := <-ch:
			got["Observe role "+label+" closed"] = fmt.Sprint(!ok)
		case <-time.After(10 * time.Second):
			got["Observe role "+label+" closed"] = "hung"
		}
	}
	// The session survives the refusals.
	l16, err := s.Acquire(ctx, prefix+strings.Repeat("x", 16-len(prefix)))
	put("Acquire 16 bytes", err)

	// Value over MaxValueBytes (4 KiB).
	_, err = s.Elect(ctx, prefix+"role", make([]byte, 4097))
	put("Elect value 4097 bytes", err)
	ld, err := s.Elect(ctx, prefix+"role", make([]byte, 4096))
	put("Elect value 4096 bytes", err)
	if ld != nil {
		put("Proclaim value 4097 bytes", ld.Proclaim(ctx, make([]byte, 4097)))
		put("Resign", ld.Resign(ctx))
	}
	_, err = o.Leader(ctx, prefix+"role")
	put("Leader of role without one", err)

	// MaxLocksPerSession is 2: l16 and a second one, then a third fails.
	_, err = s.Acquire(ctx, prefix+"a")
	put("Acquire second lock", err)
	_, err = s.Acquire(ctx, prefix+"b")
	put("Acquire third lock", err)
	_, err = s.TryAcquire(ctx, prefix+"b")
	put("TryAcquire third lock", err)

	// TryAcquire of a lock another session holds.
	_, err = other.TryAcquire(ctx, prefix+"a")
	put("TryAcquire held lock", err)
	// MaxWaitersPerLock is 1: other waits, third is refused.
	wctx, wcancel := context.WithCancel(ctx)
	waited := acquireQueued(t, wctx, other, o, prefix+"a")
	_, err = third.Acquire(ctx, prefix+"a")
	put("Acquire past waiter limit", err)
	wcancel()
	put("Acquire cancelled while waiting", (<-waited).err)

	// Release twice.
	put("Release", l16.Release(ctx))
	put("Release again", l16.Release(ctx))

	// A closed session.
	put("Close", s.Close(ctx))
	put("Close again", s.Close(ctx))
	_, err = s.Acquire(ctx, prefix+"c")
	put("Acquire on closed session", err)
	_, err = s.TryAcquire(ctx, prefix+"c")
	put("TryAcquire on closed session", err)
	_, err = s.Elect(ctx, prefix+"c", nil)
	put("Elect on closed session", err)
	put("Err of closed session", s.Err())

	// A session that ended on the cluster (revoked: the client learns it
	// at its next heartbeat, as for an expiry).
	hl, err := third.Acquire(ctx, prefix+"h")
	if err != nil {
		t.Fatal(err)
	}
	if err := admin(ctx, third.ID()); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	select {
	case <-third.Done():
	case <-time.After(2 * rbTTL):
		t.Fatalf("%s: revoked session not ended", prefix)
	}
	got["Lost closed after revoke"] = fmt.Sprint(closed(hl.Lost()))
	put("Err of revoked session", third.Err())
	_, err = third.Acquire(ctx, prefix+"i")
	put("Acquire on revoked session", err)
	put("Release on revoked session", hl.Release(ctx))
	put("Close of revoked session", third.Close(ctx))
	other.Close(ctx)
	return got
}

// A remote Session gives the same errors as a replica's for the same bad
// inputs: invalid names (also one only the cluster's MaxNameBytes
// refuses), roles and values, TTL out of range, the session, lock and
// waiter limits, calls on a closed and on a revoked session.
func TestHiddenRemoteBadInputSameAsLocal(t *testing.T) {
	t.Parallel()
	nodes := rbCluster(t, 3, func(c *quorumlock.Config) {
		c.MaxNameBytes = 16
		c.MaxLocksPerSession = 2
		c.MaxWaitersPerLock = 1
	})
	lead := specLeader(t, nodes)
	f := nodes[(lead+1)%3]
	cl := rbDial(t, specAddrs(nodes))
	local := rbBadInputs(t, f, "L", cl.RevokeSession)
	remote := rbBadInputs(t, cl, "R", cl.RevokeSession)

	want := map[string]string{
		"NewSession ttl below min":        "ErrInvalidTTL",
		"NewSession ttl above max":        "ErrInvalidTTL",
		"NewSession negative ttl":         "ErrInvalidTTL",
		"Acquire 16 bytes":                "nil",
		"Elect value 4097 bytes":          "ErrLimit",
		"Elect value 4096 bytes":          "nil",
		"Proclaim value 4097 bytes":       "ErrLimit",
		"Resign":                          "nil",
		"Leader of role without one":      "ErrNoLeader",
		"Acquire second lock":             "nil",
		"Acquire third lock":              "ErrLimit",
		"TryAcquire third lock":           "ErrLimit",
		"TryAcquire held lock":            "ErrLocked",
		"Acquire past waiter limit":       "ErrLimit",
		"Acquire cancelled while waiting": "Canceled",
		"Release":                         "nil",
		"Release again":                   "ErrNotHeld",
		"Close":                           "nil",
		"Acquire on closed session":       "ErrSessionExpired",
		"TryAcquire on closed session":    "ErrSessionExpired",
		"Elect on closed session":         "ErrSessionExpired",
		"Err of closed session":           "ErrSessionExpired",
		"Lost closed after revoke":        "true",
		"Err of revoked session":          "ErrSessionExpired",
		"Acquire on revoked session":      "ErrSessionExpired",
	}
	for _, label := range []string{"empty", "nul", "not utf8", "17 bytes", "huge"} {
		for _, call := range []string{"Acquire name ", "TryAcquire name ", "Holder name ", "Leader name ", "Session.Elect role ", "Elect role "} {
			want[call+label] = "ErrInvalidName"
		}
		want["Observe role "+label+" closed"] = "true"
	}
	for _, k := range slices.Sorted(maps.Keys(local)) {
		if local[k] != remote[k] {
			t.Errorf("%s: replica session %s, remote session %s", k, local[k], remote[k])
		}
		if w, ok := want[k]; ok && remote[k] != w {
			t.Errorf("%s: remote %s, want %s", k, remote[k], w)
		}
	}
	if len(local) != len(remote) {
		t.Errorf("cases: %d local, %d remote", len(local), len(remote))
	}
}

// A client given only followers' addresses finds the leader (NOT_LEADER
// hints): sessions, grants and reads go through, the leader sees the
// grant, and the session lives past several TTLs.
func TestHiddenRemoteFollowsNotLeader(t *testing.T) {
	nodes := rbCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	cl := rbDial(t, specAddrs(nodes, (lead+1)%3))
	ctx := testCtx(t, 30*time.Second)
	s := newSession(t, cl)
	l := mustAcquire(t, s, "x")
	info, err := nodes[lead].Holder(ctx, "x")
	if err != nil || info.Holder != s.ID() || info.Token != l.Token() {
		t.Fatalf("leader's Holder: %+v %v; want session %d token %d", info, err, s.ID(), l.Token())
	}
	if info, err := cl.Holder(ctx, "x"); err != nil || info.Holder != s.ID() || info.Token != l.Token() {
		t.Fatalf("client's Holder: %+v %v", info, err)
	}
	time.Sleep(2 * rbTTL)
	if closed(s.Done()) || closed(l.Lost()) {
		t.Fatalf("session through a follower ended: %v", s.Err())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The replica the client talks to (the leader) stops: the client moves to
// another replica, its session and lock survive, and new calls work.
func TestHiddenRemoteMovesWhenReplicaStopped(t *testing.T) {
	for _, hard := range []bool{false, true} {
		t.Run(fmt.Sprintf("hard=%v", hard), func(t *testing.T) {
			nodes, lead, cl := rbLeaderFirst(t, nil)
			// The leader's address first, so the client talks to it.
			ctx := testCtx(t, 60*time.Second)
			s := newSession(t, cl)
			l := mustAcquire(t, s, "held")
			if hard {
				nodes[lead].HardClose()
			} else {
				nodes[lead].Close()
			}
			newLead := specLeader(t, nodes, lead)
			l2, err := s.Acquire(ctx, "after")
			if err != nil {
				t.Fatalf("Acquire after the replica stopped: %v", err)
			}
			if info, err := cl.Holder(ctx, "after"); err != nil || info.Holder != s.ID() || info.Token != l2.Token() {
				t.Fatalf("client Holder after the stop: %+v %v", info, err)
			}
			time.Sleep(2 * rbTTL)
			if closed(s.Done()) || closed(l.Lost()) {
				t.Fatalf("session ended after its replica stopped: %v", s.Err())
			}
			info, err := nodes[newLead].Holder(ctx, "held")
			if err != nil || info.Holder != s.ID() || info.Token != l.Token() {
				t.Fatalf("held lock after the stop: %+v %v", info, err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Acquires in flight when the client's replica (the leader) dies have a
// definite outcome: re-sent with their (session, seq), each is granted
// exactly once, and the cluster's table agrees with what the calls
// returned. A waiting Acquire keeps its place in the queue across the
// loss and is granted when the holder goes.
func TestHiddenRemoteInFlightAcquireDefinite(t *testing.T) {
	nodes, lead, cl := rbLeaderFirst(t, nil)
	f := nodes[(lead+1)%3]
	ctx := testCtx(t, 60*time.Second)
	h := newSession(t, f)
	hl := mustAcquire(t, h, "queued")
	w := newSession(t, cl)
	waited := acquireQueued(t, ctx, w, f, "queued")

	const n = 30
	locks := make([]*quorumlock.Lock, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	var stopped atomic.Bool
	var late atomic.Int32
	for i := range n {
		wg.Go(func() {
			locks[i], errs[i] = w.Acquire(ctx, fmt.Sprintf("f%02d", i))
			if stopped.Load() {
				late.Add(1)
			}
		})
	}
	time.Sleep(time.Millisecond)
	nodes[lead].HardClose()
	stopped.Store(true)
	wg.Wait()
	t.Logf("%d of %d acquires returned after the replica stopped", late.Load(), n)
	newLead := specLeader(t, nodes, lead)
	tokens := map[quorumlock.Token]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Errorf("Acquire f%02d across the replica loss: %v", i, errs[i])
			continue
		}
		info, err := nodes[newLead].Holder(ctx, fmt.Sprintf("f%02d", i))
		if err != nil || info.Holder != w.ID() || info.Token != locks[i].Token() {
			t.Errorf("f%02d: table %+v %v, call returned token %d", i, info, err, locks[i].Token())
		}
		if tokens[locks[i].Token()] {
			t.Errorf("token %d granted twice", locks[i].Token())
		}
		tokens[locks[i].Token()] = true
	}
	if info, err := nodes[newLead].Holder(ctx, "queued"); err != nil || !slices.Equal(info.Waiters, []uint64{w.ID()}) {
		t.Fatalf("queue after the loss: %+v %v", info, err)
	}
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-waited
	if r.err != nil {
		t.Fatalf("waiting Acquire: %v", r.err)
	}
	waitLock := r.l
	info, err := nodes[newLead].Holder(ctx, "queued")
	if err != nil || info.Holder != w.ID() || info.Token != waitLock.Token() || waitLock.Token() <= hl.Token() {
		t.Fatalf("queued lock: %+v %v; returned token %d, previous %d", info, err, waitLock.Token(), hl.Token())
	}
}

// An Acquire whose ctx ends while its replica is dead still settles: it
// returns the lock (and the table agrees) or an error with the session out
// of the queue (or abandoned, which the cluster ends).
func TestHiddenRemoteInterruptedAcquireAcrossLoss(t *testing.T) {
	nodes, lead, cl := rbLeaderFirst(t, nil)
	f := nodes[(lead+1)%3]
	ctx := testCtx(t, 60*time.Second)
	h := newSession(t, f)
	mustAcquire(t, h, "q")
	w := newSession(t, cl)
	actx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	got := acquireQueued(t, actx, w, f, "q")
	nodes[lead].HardClose()
	var aerr error
	select {
	case r := <-got:
		aerr = r.err
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return after its ctx ended")
	}
	if aerr == nil {
		t.Fatal("Acquire of a held lock succeeded")
	}
	if !errors.Is(aerr, context.DeadlineExceeded) || errors.Is(aerr, quorumlock.ErrUnknownOutcome) {
		t.Fatalf("Acquire: %v; want the ctx's error, never ErrUnknownOutcome", aerr)
	}
	newLead := specLeader(t, nodes, lead)
	if w.Err() != nil {
		// Abandoned: the cluster ends the session within its TTL.
		rbWait(t, 3*rbTTL, "abandoned session's wait gone", func() bool {
			info, err := nodes[newLead].Holder(ctx, "q")
			return err == nil && !slices.Contains(info.Waiters, w.ID())
		})
		return
	}
	info, err := nodes[newLead].Holder(ctx, "q")
	if err != nil || slices.Contains(info.Waiters, w.ID()) || info.Holder != h.ID() {
		t.Fatalf("after the interrupted Acquire returned: %+v %v", info, err)
	}
}

// Leader, Observe and Holder through the client follow elections made on
// replicas and by the client itself, in epoch order, with the no-leader
// event between two leaders.
func TestHiddenRemoteObserveLeaderHolder(t *testing.T) {
	nodes := rbCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	cl := rbDial(t, specAddrs(nodes, (lead+1)%3))
	ctx := testCtx(t, 60*time.Second)
	if _, err := cl.Leader(ctx, "sched"); !errors.Is(err, quorumlock.ErrNoLeader) {
		t.Fatalf("Leader with none: %v", err)
	}
	events := cl.Observe(ctx, "sched")
	if ev := nextEvent(t, events); ev.Session != 0 {
		t.Fatalf("first event %+v; want no leader", ev)
	}
	a, err := nodes[lead].Elect(ctx, "sched", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, events)
	if ev.Epoch != a.Epoch() || string(ev.Value) != "a" || ev.Role != "sched" || ev.Session == 0 {
		t.Fatalf("event %+v; want a's epoch %d", ev, a.Epoch())
	}
	if li, err := cl.Leader(ctx, "sched"); err != nil || li.Epoch != a.Epoch() || string(li.Value) != "a" || li.Session != ev.Session {
		t.Fatalf("Leader: %+v %v", li, err)
	}
	if err := a.Proclaim(ctx, []byte("a2")); err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, events); ev.Epoch != a.Epoch() || string(ev.Value) != "a2" {
		t.Fatalf("after Proclaim: %+v", ev)
	}
	// The client campaigns behind a; a resigns.
	bch := make(chan *quorumlock.Leadership, 1)
	go func() {
		b, err := cl.Elect(ctx, "sched", []byte("b"))
		if err != nil {
			t.Error(err)
		}
		bch <- b
	}()
	rbWait(t, 10*time.Second, "client candidate queued", func() bool {
		info, _, err := cl.Locks(ctx, "", 10)
		return err == nil && len(info) == 1 && len(info[0].Waiters) == 1
	})
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	b := <-bch
	if b == nil {
		t.FailNow()
	}
	if ev := nextEvent(t, events); ev.Session != 0 || ev.Epoch != a.Epoch() {
		t.Fatalf("between leaders: %+v; want no leader with the last epoch %d", ev, a.Epoch())
	}
	if ev := nextEvent(t, events); ev.Epoch != b.Epoch() || b.Epoch() <= a.Epoch() || string(ev.Value) != "b" {
		t.Fatalf("second leader: %+v, epochs a %d b %d", ev, a.Epoch(), b.Epoch())
	}
	// Holder of the role's name is a lock namespace: the role does not
	// show there.
	if info, err := cl.Holder(ctx, "sched"); err != nil || info.Holder != 0 {
		t.Fatalf("Holder of a lock named like the role: %+v %v", info, err)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

// Client.Close ends everything opened through it (sessions, locks,
// leaderships, Observe streams, a waiting Acquire) and later calls return
// ErrClosed; the cluster frees the locks once their TTL runs out.
func TestHiddenRemoteCloseEndsEverything(t *testing.T) {
	t.Parallel()
	nodes := rbCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	cl := rbDial(t, specAddrs(nodes))
	ctx := testCtx(t, 60*time.Second)
	h := newSession(t, nodes[lead])
	mustAcquire(t, h, "busy")
	s := newSession(t, cl)
	l := mustAcquire(t, s, "mine")
	ld, err := cl.Elect(ctx, "role", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	obs := cl.Observe(ctx, "role")
	if ev := <-obs; ev.Epoch != ld.Epoch() {
		t.Fatalf("observe: %+v", ev)
	}
	waiting := acquireQueued(t, ctx, s, cl, "busy")

	closeErr := make(chan error, 1)
	go func() { closeErr <- cl.Close() }()
	select {
	case err := <-closeErr:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung")
	}
	select {
	case r := <-waiting:
		if !errors.Is(r.err, quorumlock.ErrClosed) {
			t.Errorf("waiting Acquire: %v; want ErrClosed", r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiting Acquire did not return after Close")
	}
	if !closed(s.Done()) || !closed(l.Lost()) || !closed(ld.Done()) {
		t.Fatalf("after Close: Done %v, Lost %v, leadership Done %v", closed(s.Done()), closed(l.Lost()), closed(ld.Done()))
	}
	if !errors.Is(s.Err(), quorumlock.ErrClosed) {
		t.Errorf("Session.Err: %v", s.Err())
	}
	if !observeEnds(obs, 10*time.Second) {
		t.Fatal("Observe not closed by Close")
	}
	if err := cl.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, quorumlock.ErrClosed) {
			t.Errorf("%s after Close: %v; want ErrClosed", what, err)
		}
	}
	_, err = cl.NewSession(ctx)
	check("NewSession", err)
	_, err = cl.Holder(ctx, "mine")
	check("Holder", err)
	_, err = cl.Leader(ctx, "role")
	check("Leader", err)
	_, err = cl.Elect(ctx, "role2", nil)
	check("Elect", err)
	_, _, err = cl.Locks(ctx, "", 10)
	check("Locks", err)
	_, _, err = cl.Sessions(ctx, 0, 10)
	check("Sessions", err)
	check("RevokeSession", cl.RevokeSession(ctx, h.ID()))
	for _, r := range cl.Status(ctx) {
		check("Status "+r.Addr, r.Err)
	}
	_, err = s.Acquire(ctx, "other")
	check("Session.Acquire", err)
	_, err = s.TryAcquire(ctx, "other")
	check("Session.TryAcquire", err)
	if _, ok := <-cl.Observe(ctx, "role"); ok {
		t.Error("Observe after Close delivered an event")
	}
	// Nothing was released through the log: the cluster frees the locks
	// when the sessions' TTL runs out.
	rbWait(t, 3*rbTTL, "client's locks freed after the TTL", func() bool {
		info, err := nodes[lead].Holder(ctx, "mine")
		li, lerr := nodes[lead].Leader(ctx, "role")
		return err == nil && info.Holder == 0 && errors.Is(lerr, quorumlock.ErrNoLeader) && li.Session == 0
	})
	if err := h.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// Dial returns within its ctx when nothing listens at the addresses or a
// listener never answers, with ctx's error or the replicas' error, never
// ErrInvalidConfig; it returns before the ctx ends when every address
// refuses.
func TestHiddenRemoteDialNothingListening(t *testing.T) {
	refused := []string{deadAddr(t), deadAddr(t), deadAddr(t)}
	// A listener that accepts and never speaks (a paused process's port).
	mute := silentListener(t)

	for _, tc := range []struct {
		name  string
		addrs []string
		ctx   time.Duration
	}{
		{"refused long ctx", refused, 20 * time.Second},
		{"refused short ctx", refused, 300 * time.Millisecond},
		{"mute short ctx", []string{mute.Addr().String()}, 300 * time.Millisecond},
		{"mute and refused", append([]string{mute.Addr().String()}, refused...), 700 * time.Millisecond},
		{"mute default election timeout", []string{mute.Addr().String(), mute.Addr().String()}, 800 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), tc.ctx)
			defer cancel()
			start := time.Now()
			opts := []quorumlock.ClientOption{quorumlock.WithElectionTimeout(rbET)}
			if strings.Contains(tc.name, "default") {
				opts = nil
			}
			cl, err := quorumlock.Dial(ctx, tc.addrs, opts...)
			took := time.Since(start)
			if err == nil {
				cl.Close()
				t.Fatal("Dial succeeded with nothing serving")
			}
			if errors.Is(err, quorumlock.ErrInvalidConfig) {
				t.Fatalf("Dial: %v; not a config error", err)
			}
			// Slack for a loaded machine; the point is that Dial does not
			// outlive its ctx by attempts of its own.
			if took > tc.ctx+2*time.Second {
				t.Fatalf("Dial took %v with a ctx of %v", took, tc.ctx)
			}
			if tc.ctx < 10*time.Second && ctx.Err() == nil && strings.Contains(tc.name, "mute") {
				t.Logf("Dial gave up before the ctx ended: %v", err)
			}
		})
	}
	// A ctx that has already ended.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := quorumlock.Dial(ctx, refused); !errors.Is(err, context.Canceled) {
		t.Errorf("Dial with an ended ctx: %v; want context.Canceled", err)
	}
}

// A client cut off from the whole cluster (every replica stopped) loses
// its session by its own lease, no later than Session.Deadline (send time
// of the last acknowledged heartbeat + TTL - TTL/10): Lost and Done close,
// and calls return ErrSessionExpired. It never holds a lock on trust.
func TestHiddenRemoteCutOffLosesLease(t *testing.T) {
	t.Parallel()
	nodes := rbCluster(t, 3, nil)
	specLeader(t, nodes)
	cl := rbDial(t, specAddrs(nodes))
	ctx := testCtx(t, 30*time.Second)
	s := newSession(t, cl)
	l := mustAcquire(t, s, "x")
	for _, n := range nodes {
		n.HardClose()
	}
	// No heartbeat can be acknowledged from here on: the deadline is final.
	deadline := s.Deadline()
	if d := time.Until(deadline); d > rbTTL-rbTTL/10 {
		t.Fatalf("deadline %v ahead, more than TTL - TTL/10", d)
	}
	select {
	case <-l.Lost():
	case <-time.After(time.Until(deadline) + time.Second):
		t.Fatalf("Lost not closed by the lease deadline (+1 s)")
	}
	// The session's end sets Err, closes its locks' Lost, then Done (so
	// that whoever sees Done closed sees every Lost closed too): Err is
	// set by now, and Done closes right after.
	if !errors.Is(s.Err(), quorumlock.ErrSessionExpired) {
		t.Fatalf("Err %v once Lost closed, want ErrSessionExpired", s.Err())
	}
	select {
	case <-s.Done():
	case <-time.After(time.Second):
		t.Fatal("Done still open 1 s after Lost closed")
	}
	if _, err := s.Acquire(ctx, "y"); !errors.Is(err, quorumlock.ErrSessionExpired) {
		t.Fatalf("Acquire after the lease ran out: %v", err)
	}
}

// A session the cluster expired (its client's clock stood still, so no
// heartbeat went out for longer than the TTL) is never renewed: the next
// heartbeat learns it is gone, Lost closes, calls return
// ErrSessionExpired, and the lock went to another session with a larger
// token.
func TestHiddenRemoteExpiredOnClusterNotRenewed(t *testing.T) {
	nodes := rbCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	clk := clock.NewManual(time.Now())
	cl := rbDial(t, specAddrs(nodes), quorumlock.WithClock(clk))
	ctx := testCtx(t, 30*time.Second)
	s, err := cl.NewSession(ctx, quorumlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l := mustAcquire(t, s, "x")
	other := newSession(t, nodes[lead])
	ol, err := other.Acquire(ctx, "x") // granted once the cluster expires s
	if err != nil {
		t.Fatal(err)
	}
	if ol.Token() <= l.Token() {
		t.Fatalf("token %d after %d", ol.Token(), l.Token())
	}
	if closed(l.Lost()) {
		t.Fatal("Lost closed while the client's clock stood still")
	}
	// Time moves on for the client, within its lease: the heartbeat that
	// goes out is answered "gone".
	clk.Advance(time.Second/3 + time.Millisecond)
	select {
	case <-l.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("Lost not closed after the heartbeat found the session gone")
	}
	if !errors.Is(s.Err(), quorumlock.ErrSessionExpired) {
		t.Fatalf("Err: %v", s.Err())
	}
	if _, err := s.TryAcquire(ctx, "z"); !errors.Is(err, quorumlock.ErrSessionExpired) {
		t.Fatalf("TryAcquire on the expired session: %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, quorumlock.ErrSessionExpired) && !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Fatalf("Release of the lost lock: %v", err)
	}
	if info, err := cl.Holder(ctx, "x"); err != nil || info.Holder != other.ID() || info.Token != ol.Token() {
		t.Fatalf("Holder: %+v %v", info, err)
	}
}

// An Observe stream through the client survives the loss of the replica
// serving it and reports the next leadership.
func TestHiddenRemoteObserveAcrossReplicaLoss(t *testing.T) {
	for _, withSession := range []bool{true, false} {
		t.Run(fmt.Sprintf("session=%v", withSession), func(t *testing.T) { rbObserveAcrossLoss(t, withSession) })
	}
}

func rbObserveAcrossLoss(t *testing.T, withSession bool) {
	nodes, lead, cl := rbLeaderFirst(t, nil)
	a, b := nodes[(lead+1)%3], nodes[(lead+2)%3]
	ctx := testCtx(t, 60*time.Second)
	// A session on the client keeps its heartbeats (and so its idea of the
	// leader) current; without one, the failed stream alone moves.
	if withSession {
		if _, err := cl.NewSession(ctx); err != nil {
			t.Fatal(err)
		}
	}
	events := cl.Observe(ctx, "r")
	la, err := a.Elect(ctx, "r", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	for ev := range events {
		if ev.Epoch == la.Epoch() {
			break
		}
	}
	nodes[lead].HardClose()
	specLeader(t, nodes, lead)
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	lb, err := b.Elect(ctx, "r", []byte("b"))
	if err != nil {
		t.Fatal(err)
	}
	timeout := time.After(15 * time.Second)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("Observe closed")
			}
			if ev.Epoch > lb.Epoch() {
				t.Fatalf("event %+v past b's epoch %d", ev, lb.Epoch())
			}
			if ev.Epoch == lb.Epoch() && ev.Session != 0 {
				if string(ev.Value) != "b" {
					t.Fatalf("event %+v", ev)
				}
				return
			}
		case <-timeout:
			t.Fatal("b's leadership not observed after the serving replica stopped")
		}
	}
}

// Dial skips addresses where nothing listens, or where a listener never
// answers, and returns a working client from the replicas that do.
func TestHiddenRemoteDialSkipsDeadAddresses(t *testing.T) {
	nodes := rbCluster(t, 1, nil)
	specLeader(t, nodes)
	dead := deadAddr(t)
	// A listener that never accepts.
	mute := mustListen(t)
	defer mute.Close()
	cl := rbDial(t, []string{dead, mute.Addr().String(), nodes[0].Addr().String()})
	ctx := testCtx(t, 20*time.Second)
	s := newSession(t, cl)
	mustAcquire(t, s, "x")
	if info, err := cl.Holder(ctx, "x"); err != nil || info.Holder != s.ID() {
		t.Fatalf("Holder: %+v %v", info, err)
	}
}

// Through a client whose only reachable replica is cut off from the
// majority, reads and new sessions block until their ctx ends and return
// its error; they never answer from stale state. Once the majority is
// back, the same client works.
func TestHiddenRemoteMinorityBlocksUntilCtx(t *testing.T) {
	nodes := rbCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	cl := rbDial(t, specAddrs(nodes, lead))
	ctx := testCtx(t, 30*time.Second)
	s := newSession(t, cl)
	mustAcquire(t, s, "x")
	nodes[(lead+1)%3].HardClose()
	nodes[(lead+2)%3].HardClose()
	for _, call := range []struct {
		name string
		f    func(context.Context) error
	}{
		{"Holder", func(c context.Context) error { _, err := cl.Holder(c, "x"); return err }},
		{"Leader", func(c context.Context) error { _, err := cl.Leader(c, "r"); return err }},
		{"NewSession", func(c context.Context) error { _, err := cl.NewSession(c); return err }},
	} {
		c, cancel := context.WithTimeout(ctx, time.Second)
		start := time.Now()
		err := call.f(c)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s without a majority: %v; want DeadlineExceeded", call.name, err)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("%s took %v with a 1 s ctx", call.name, took)
		}
	}
}

// Dial refuses bad addresses and options with ErrInvalidConfig, at once.
func TestHiddenRemoteDialBadInput(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	for _, tc := range []struct {
		name  string
		addrs []string
		opts  []quorumlock.ClientOption
	}{
		{"no addresses", nil, nil},
		{"empty list", []string{}, nil},
		{"empty address", []string{""}, nil},
		{"no port", []string{"127.0.0.1"}, nil},
		{"dns without port", []string{"dns:///localhost"}, nil},
		{"ttl below min", []string{"127.0.0.1:1"}, []quorumlock.ClientOption{quorumlock.WithSessionTTL(time.Millisecond)}},
		{"ttl above max", []string{"127.0.0.1:1"}, []quorumlock.ClientOption{quorumlock.WithSessionTTL(time.Hour)}},
		{"zero election timeout", []string{"127.0.0.1:1"}, []quorumlock.ClientOption{quorumlock.WithElectionTimeout(0)}},
		{"nil clock", []string{"127.0.0.1:1"}, []quorumlock.ClientOption{quorumlock.WithClock(nil)}},
	} {
		cl, err := quorumlock.Dial(ctx, tc.addrs, tc.opts...)
		if !errors.Is(err, quorumlock.ErrInvalidConfig) {
			if cl != nil {
				cl.Close()
			}
			t.Errorf("%s: %v; want ErrInvalidConfig", tc.name, err)
		}
	}
}

// Releases, TryAcquires and a Close of another session in flight when the
// client's replica (the leader) dies each take effect once and report
// their original outcome: a re-sent Release that was applied before the
// loss still returns nil, not ErrNotHeld.
func TestHiddenRemoteInFlightReleaseDefinite(t *testing.T) {
	nodes, lead, cl := rbLeaderFirst(t, nil)
	ctx := testCtx(t, 60*time.Second)
	s := newSession(t, cl)
	closing, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cl2 := mustAcquire(t, closing, "closing")
	const n = 20
	held := make([]*quorumlock.Lock, n)
	for i := range n {
		if held[i], err = s.Acquire(ctx, fmt.Sprintf("r%02d", i)); err != nil {
			t.Fatal(err)
		}
	}
	relErr := make([]error, n)
	tries := make([]*quorumlock.Lock, n)
	tryErr := make([]error, n)
	var closeErr error
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { relErr[i] = held[i].Release(ctx) })
		wg.Go(func() { tries[i], tryErr[i] = s.TryAcquire(ctx, fmt.Sprintf("t%02d", i)) })
	}
	wg.Go(func() { closeErr = closing.Close(ctx) })
	time.Sleep(time.Millisecond)
	nodes[lead].HardClose()
	wg.Wait()
	newLead := specLeader(t, nodes, lead)
	for i := range n {
		if relErr[i] != nil {
			t.Errorf("Release r%02d across the loss: %v", i, relErr[i])
		}
		if info, err := nodes[newLead].Holder(ctx, fmt.Sprintf("r%02d", i)); err != nil || info.Holder != 0 {
			t.Errorf("r%02d after Release: %+v %v", i, info, err)
		}
		if tryErr[i] != nil {
			t.Errorf("TryAcquire t%02d across the loss: %v", i, tryErr[i])
			continue
		}
		if info, err := nodes[newLead].Holder(ctx, fmt.Sprintf("t%02d", i)); err != nil || info.Holder != s.ID() || info.Token != tries[i].Token() {
			t.Errorf("t%02d: %+v %v, returned token %d", i, info, err, tries[i].Token())
		}
	}
	if closeErr != nil {
		t.Errorf("Close across the loss: %v", closeErr)
	}
	if !closed(cl2.Lost()) {
		t.Error("closed session's lock not lost")
	}
	if info, err := nodes[newLead].Holder(ctx, "closing"); err != nil || info.Holder != 0 {
		t.Errorf("closed session's lock: %+v %v", info, err)
	}
}

// rbNet lets a test pause a replica (no byte in or out of any of its
// connections, as under SIGSTOP) or cut it off from its peers (clients
// still reach it), using only Config.Listener and Config.Dialer.
type rbNet struct {
	mu       sync.Mutex
	wake     chan struct{} // closed and replaced on every change
	paused   map[uint64]bool
	isolated map[uint64]bool
	ids      map[string]uint64 // peer address -> ID
}

func newRBNet() *rbNet {
	return &rbNet{wake: make(chan struct{}), paused: map[uint64]bool{}, isolated: map[uint64]bool{}, ids: map[string]uint64{}}
}

func (n *rbNet) set(m map[uint64]bool, id uint64, on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	m[id] = on
	close(n.wake)
	n.wake = make(chan struct{})
}

func (n *rbNet) pause(id uint64, on bool)   { n.set(n.paused, id, on) }
func (n *rbNet) isolate(id uint64, on bool) { n.set(n.isolated, id, on) }

type rbConn struct {
	net.Conn
	n      *rbNet
	frozen func() bool // called with n.mu held
	closed chan struct{}
	once   sync.Once
}

// hold blocks while the connection is frozen.
func (c *rbConn) hold() error {
	for {
		c.n.mu.Lock()
		f, w := c.frozen(), c.n.wake
		c.n.mu.Unlock()
		if !f {
			return nil
		}
		select {
		case <-w:
		case <-c.closed:
			return net.ErrClosed
		}
	}
}

func (c *rbConn) Read(p []byte) (int, error) {
	if err := c.hold(); err != nil {
		return 0, err
	}
	k, err := c.Conn.Read(p)
	// Bytes that arrived while frozen are delivered after the thaw.
	if herr := c.hold(); herr != nil {
		return 0, herr
	}
	return k, err
}

func (c *rbConn) Write(p []byte) (int, error) {
	if err := c.hold(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *rbConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

type rbListener struct {
	net.Listener
	n  *rbNet
	id uint64
}

func (l *rbListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &rbConn{Conn: c, n: l.n, closed: make(chan struct{}), frozen: func() bool { return l.n.paused[l.id] }}, nil
}

// configure wires c's replica into the network.
func (n *rbNet) configure(c *quorumlock.Config) {
	id := c.ID
	n.mu.Lock()
	for pid, a := range c.Peers {
		n.ids[a] = pid
	}
	n.mu.Unlock()
	c.Listener = &rbListener{Listener: c.Listener, n: n, id: id}
	c.Dialer = func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		raw, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		n.mu.Lock()
		to := n.ids[addr]
		n.mu.Unlock()
		return &rbConn{Conn: raw, n: n, closed: make(chan struct{}), frozen: func() bool {
			return n.paused[id] || n.paused[to] || n.isolated[id] || n.isolated[to]
		}}, nil
	}
}

// The client's replica (the leader) is paused (as by SIGSTOP) or cut off
// from its peers while the client holds a lock and waits for another: the
// client moves to the new leader, its session and lock survive, new calls
// work, and the waiting Acquire is granted when the holder releases, well
// before gRPC keepalive (10-20 s) would notice the paused replica.
func TestHiddenRemotePausedOrCutOffLeader(t *testing.T) {
	for _, mode := range []string{"paused", "cut off"} {
		t.Run(mode, func(t *testing.T) {
			nw := newRBNet()
			nodes, lead, cl := rbLeaderFirst(t, nw.configure)
			f := nodes[(lead+1)%3]
			ctx := testCtx(t, 60*time.Second)
			h := newSession(t, f)
			hl := mustAcquire(t, h, "q")
			s := newSession(t, cl)
			l := mustAcquire(t, s, "x")
			waited := acquireQueued(t, ctx, s, f, "q")
			events := cl.Observe(ctx, "role")
			select {
			case ev := <-events:
				if ev.Session != 0 {
					t.Fatalf("first Observe event %+v", ev)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no first Observe event")
			}
			id := nodes[lead].ID()
			if mode == "paused" {
				nw.pause(id, true)
			} else {
				nw.isolate(id, true)
			}
			defer nw.pause(id, false)
			defer nw.isolate(id, false)
			newLead := specLeader(t, nodes, lead)
			// The holder, on a live replica, releases: s is next.
			if err := hl.Release(ctx); err != nil {
				t.Fatal(err)
			}
			var wl *quorumlock.Lock
			select {
			case r := <-waited:
				if r.err != nil {
					t.Fatalf("waiting Acquire: %v", r.err)
				}
				wl = r.l
			case <-time.After(3 * rbTTL):
				t.Fatalf("waiting Acquire not granted within %v of the release", 3*rbTTL)
			}
			info, err := nodes[newLead].Holder(ctx, "q")
			if err != nil || info.Holder != s.ID() || info.Token != wl.Token() {
				t.Fatalf("q: %+v %v, returned token %d", info, err, wl.Token())
			}
			c, cancel := context.WithTimeout(ctx, 3*rbTTL)
			l2, err := s.Acquire(c, "y")
			cancel()
			if err != nil {
				t.Fatalf("Acquire with the old leader %s: %v", mode, err)
			}
			c, cancel = context.WithTimeout(ctx, 3*rbTTL)
			yi, err := cl.Holder(c, "y")
			cancel()
			if err != nil || yi.Token != l2.Token() {
				t.Fatalf("client Holder: %+v %v", yi, err)
			}
			// The Observe stream, served by the old leader, moves too.
			ld, err := f.Elect(ctx, "role", []byte("v"))
			if err != nil {
				t.Fatal(err)
			}
			timeout := time.After(3 * rbTTL)
		observed:
			for {
				select {
				case ev := <-events:
					if ev.Epoch == ld.Epoch() && ev.Session != 0 {
						break observed
					}
				case <-timeout:
					t.Fatalf("leadership not observed with the old leader %s", mode)
				}
			}
			time.Sleep(rbTTL)
			if closed(s.Done()) || closed(l.Lost()) {
				t.Fatalf("session lost with the old leader %s: %v", mode, s.Err())
			}
		})
	}
}

// Client.Close while the client's replica has just died and requests are
// being re-sent: every call returns ErrClosed promptly, none hangs.
func TestHiddenRemoteCloseDuringFailover(t *testing.T) {
	nodes, lead, cl := rbLeaderFirst(t, nil)
	f := nodes[(lead+1)%3]
	ctx := testCtx(t, 60*time.Second)
	h := newSession(t, f)
	mustAcquire(t, h, "busy")
	s := newSession(t, cl)
	const n = 10
	errs := make(chan error, 2*n)
	for i := range n {
		go func() { _, err := s.Acquire(ctx, "busy"); errs <- err }()
		go func() { _, err := s.Acquire(ctx, fmt.Sprintf("free%d", i)); errs <- err }()
	}
	rbWait(t, 10*time.Second, "queued", func() bool {
		info, err := f.Holder(ctx, "busy")
		return err == nil && slices.Contains(info.Waiters, s.ID())
	})
	nodes[lead].HardClose()
	cl.Close()
	timeout := time.After(10 * time.Second)
	for range 2 * n {
		select {
		case err := <-errs:
			if err != nil && !errors.Is(err, quorumlock.ErrClosed) {
				t.Errorf("call across Close: %v; want nil or ErrClosed", err)
			}
		case <-timeout:
			t.Fatal("a call hung after Client.Close")
		}
	}
	if !errors.Is(s.Err(), quorumlock.ErrClosed) {
		t.Errorf("session Err after Close: %v", s.Err())
	}
}

// MaxSessions through the client: NewSession past the limit fails with
// ErrLimit, as on a replica.
func TestHiddenRemoteSessionLimit(t *testing.T) {
	nodes := rbCluster(t, 1, func(c *quorumlock.Config) { c.MaxSessions = 2 })
	specLeader(t, nodes)
	cl := rbDial(t, specAddrs(nodes, 0))
	ctx := testCtx(t, 20*time.Second)
	a := newSession(t, cl)
	if _, err := nodes[0].NewSession(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.NewSession(ctx); !errors.Is(err, quorumlock.ErrLimit) {
		t.Fatalf("client NewSession past MaxSessions: %v", err)
	}
	if _, err := nodes[0].NewSession(ctx); !errors.Is(err, quorumlock.ErrLimit) {
		t.Fatalf("replica NewSession past MaxSessions: %v", err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.NewSession(ctx); err != nil {
		t.Fatalf("NewSession after one closed: %v", err)
	}
}

// Calls with a ctx that has already ended, or that ends while waiting,
// give the same outcome on a remote session as on a replica's, and leave
// nothing queued; Session.Close frees the session's locks for the next
// waiter at once, with a larger token.
func TestHiddenRemoteCtxAndCloseSameAsLocal(t *testing.T) {
	nodes := rbCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	f := nodes[(lead+1)%3]
	cl := rbDial(t, specAddrs(nodes))
	ctx := testCtx(t, 60*time.Second)
	h := newSession(t, nodes[lead])
	results := map[string]map[string]string{}
	for _, o := range []struct {
		name string
		o    opener
	}{{"replica", f}, {"client", cl}} {
		got := map[string]string{}
		results[o.name] = got
		p := o.name + "/"
		hl := mustAcquire(t, h, p+"held")
		s := newSession(t, o.o)
		done, cancel := context.WithCancel(ctx)
		cancel()
		_, err := s.Acquire(done, p+"held")
		got["Acquire held, ended ctx"] = rbKind(err)
		_, err = s.TryAcquire(done, p+"held")
		got["TryAcquire held, ended ctx"] = rbKind(err)
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = s.Acquire(short, p+"held")
		cancel()
		got["Acquire held, deadline"] = rbKind(err)
		got["session alive after deadline"] = fmt.Sprint(s.Err() == nil)
		info, err := h.Acquire(ctx, p+"held") // the same grant: h holds it
		if err != nil || info.Token() != hl.Token() {
			t.Fatalf("re-acquire by the holder: %v %v", info, err)
		}
		hi, err := o.o.Holder(ctx, p+"held")
		got["queued after ctx ended"] = fmt.Sprint(err != nil || len(hi.Waiters) != 0)

		// Close frees s's lock for h, which waits.
		sl := mustAcquire(t, s, p+"free")
		granted := acquireQueued(t, ctx, h, o.o, p+"free")
		got["Close"] = rbKind(s.Close(ctx))
		select {
		case r := <-granted:
			if r.err != nil {
				t.Error(r.err)
			}
			got["next waiter granted with larger token"] = fmt.Sprint(r.l != nil && r.l.Token() > sl.Token())
		case <-time.After(rbTTL / 2):
			got["next waiter granted with larger token"] = "not within TTL/2"
		}
		got["Lost closed by Close"] = fmt.Sprint(closed(sl.Lost()))
	}
	for k, v := range results["replica"] {
		if results["client"][k] != v {
			t.Errorf("%s: replica %s, client %s", k, v, results["client"][k])
		}
	}
	t.Logf("%v", results["client"])
}

// A candidate whose ctx ends while it waits never leads (through a replica
// and through the client alike); an Acquire waiting when an operator
// revokes its session returns ErrSessionExpired; Proclaim after Resign is
// ErrNotHeld.
func TestHiddenRemoteElectWithdrawAndRevokeWaiter(t *testing.T) {
	nodes := rbCluster(t, 3, nil)
	lead := specLeader(t, nodes)
	f := nodes[(lead+1)%3]
	cl := rbDial(t, specAddrs(nodes))
	ctx := testCtx(t, 60*time.Second)
	for _, o := range []struct {
		name string
		o    opener
	}{{"replica", f}, {"client", cl}} {
		role := o.name + "-role"
		first, err := nodes[lead].Elect(ctx, role, []byte("first"))
		if err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err = o.o.Elect(short, role, []byte("late"))
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: Elect behind a leader with a short ctx: %v", o.name, err)
		}
		if err := first.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if li, err := o.o.Leader(ctx, role); !errors.Is(err, quorumlock.ErrNoLeader) {
			t.Errorf("%s: after the leader resigned: %+v %v; the withdrawn candidate must not lead", o.name, li, err)
		}
		ld, err := o.o.Elect(ctx, role, []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		if err := ld.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if err := ld.Proclaim(ctx, []byte("w")); !errors.Is(err, quorumlock.ErrNotHeld) {
			t.Errorf("%s: Proclaim after Resign: %v", o.name, err)
		}

		// A waiter whose session is revoked.
		h := newSession(t, nodes[lead])
		mustAcquire(t, h, o.name+"-lock")
		w := newSession(t, o.o)
		got := acquireQueued(t, ctx, w, o.o, o.name+"-lock")
		if err := cl.RevokeSession(ctx, w.ID()); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if !errors.Is(r.err, quorumlock.ErrSessionExpired) {
				t.Errorf("%s: waiting Acquire of a revoked session: %v", o.name, r.err)
			}
		case <-time.After(2 * rbTTL):
			t.Errorf("%s: waiting Acquire of a revoked session did not return", o.name)
		}
		h.Close(ctx)
	}
}
