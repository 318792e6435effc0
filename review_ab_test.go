package quorumlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// Review AB. A deaf leader: every link into the leader is cut one way, so
// it goes on sending appends and heartbeats (the followers keep it as
// their leader until CheckQuorum steps it down) but hears nothing, and
// after it steps down it never learns who leads. Its own replica holds a
// lock and leads a role through a session; a session on a follower waits
// for both. The holder's Lost and the leadership's Done must close before
// the waiter is granted either (invariants 3 and 5), the new grants carry
// larger tokens that make the fence refuse the old ones (invariant 2), the
// old leadership's Proclaim is refused, and after the heal the old session
// is over for good and the table names the waiter (invariant 5: never
// resurrected).
func TestReviewABDeafLeaderHolderLosesFirst(t *testing.T) {
	t.Parallel()
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: testTTL})
	lead := c.WaitLeader(5 * time.Second)
	a := newSession(t, c.Node(lead))
	la := mustAcquire(t, a, "r")
	lda, err := a.Elect(testCtx(t, 10*time.Second), "sched", []byte("a"))
	if err != nil {
		t.Fatalf("a.Elect: %v", err)
	}
	f := follower(c, lead)
	b := newSession(t, c.Node(f))

	type grant struct {
		at    time.Time
		token quorumlock.Token
		err   error
	}
	lockc, electc := make(chan grant, 1), make(chan grant, 1)
	var ldb *quorumlock.Leadership
	go func() {
		l, err := b.Acquire(testCtx(t, 30*time.Second), "r")
		if err != nil {
			lockc <- grant{err: err}
			return
		}
		lockc <- grant{at: time.Now(), token: l.Token()}
	}()
	go func() {
		ld, err := b.Elect(testCtx(t, 30*time.Second), "sched", []byte("b"))
		if err != nil {
			electc <- grant{err: err}
			return
		}
		ldb = ld
		electc <- grant{at: time.Now(), token: ld.Epoch()}
	}()
	waitCandidate(t, c.Node(lead), "sched", b.ID())

	cutAt := time.Now()
	for _, id := range c.IDs() {
		if id != lead {
			c.Net.Cut(id, lead)
		}
	}
	var lostAt, doneAt time.Time
	for lostAt.IsZero() || doneAt.IsZero() {
		select {
		case <-la.Lost():
			if lostAt.IsZero() {
				lostAt = time.Now()
			}
		case <-lda.Done():
			if doneAt.IsZero() {
				doneAt = time.Now()
			}
		case <-time.After(4 * testTTL):
			t.Fatal("the deaf leader's holder was never told it lost the lock or the role")
		}
		if !lostAt.IsZero() && doneAt.IsZero() {
			select {
			case <-lda.Done():
				doneAt = time.Now()
			default:
			}
		}
	}
	gl, ge := <-lockc, <-electc
	if gl.err != nil || ge.err != nil {
		t.Fatalf("waiter: Acquire %v, Elect %v", gl.err, ge.err)
	}
	if !lostAt.Before(gl.at) {
		t.Fatalf("lock granted to the waiter %v after the cut, before the holder's Lost at %v", gl.at.Sub(cutAt), lostAt.Sub(cutAt))
	}
	if !doneAt.Before(ge.at) {
		t.Fatalf("role granted to the waiter %v after the cut, before the old leadership's Done at %v", ge.at.Sub(cutAt), doneAt.Sub(cutAt))
	}
	if gl.token <= la.Token() || ge.token <= lda.Epoch() {
		t.Fatalf("new grants lock %d, role %d not above %d, %d", gl.token, ge.token, la.Token(), lda.Epoch())
	}
	fence := quorumlock.NewFence()
	if err := fence.Admit("r", gl.token); err != nil {
		t.Fatal(err)
	}
	if err := fence.Admit("r", la.Token()); !errors.Is(err, quorumlock.ErrStaleToken) {
		t.Fatalf("fence admitted the deaf leader's holder: %v", err)
	}
	if err := lda.Proclaim(testCtx(t, 2*time.Second), []byte("stale")); err == nil {
		t.Fatal("the old leadership proclaimed after it ended")
	}

	c.Heal()
	if !errors.Is(a.Err(), quorumlock.ErrSessionExpired) {
		t.Fatalf("old session after the heal: %v", a.Err())
	}
	// The healed replica reads the majority's table, not its stale one.
	if info := holder(t, c.Node(lead), "r"); info.Holder != b.ID() || info.Token != gl.token {
		t.Fatalf("holder of r on the healed replica: %+v, want session %d token %d", info, b.ID(), gl.token)
	}
	li, err := c.Node(lead).Leader(testCtx(t, 10*time.Second), "sched")
	if err != nil || li.Session != b.ID() || li.Epoch != ge.token || string(li.Value) != "b" {
		t.Fatalf("leader of sched on the healed replica: %+v, %v", li, err)
	}
	if err := ldb.Proclaim(testCtx(t, 10*time.Second), []byte("b2")); err != nil {
		t.Fatalf("new leadership's Proclaim: %v", err)
	}
}

// Review AB. A follower hosting a role's leader and an observer of the
// role is cut off; the majority expires the leader's session in an Expire
// that hands the role to a waiter, then logs enough to snapshot and
// compact past the follower, which catches up by installing the snapshot.
// The follower's Observe stream, served from its own applied state, must
// go from the old leader through "no leader" to the new one without a
// lower epoch, and its linearizable reads must show the new holder, with
// the old session over for good (invariants 2, 5, 9).
func TestReviewABObserveAcrossSnapshotInstall(t *testing.T) {
	t.Parallel()
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: testTTL, Configure: func(cfg *quorumlock.Config) {
		cfg.SnapshotEntries = 8
	}})
	lead := c.WaitLeader(5 * time.Second)
	f := follower(c, lead)
	ctx := testCtx(t, 60*time.Second)
	a := newSession(t, c.Node(f))
	lda, err := a.Elect(ctx, "sched", []byte("a"))
	if err != nil {
		t.Fatalf("a.Elect: %v", err)
	}
	la := mustAcquire(t, a, "r")
	events := c.Node(f).Observe(ctx, "sched")
	if ev := nextEvent(t, events); ev.Session != a.ID() || ev.Epoch != lda.Epoch() {
		t.Fatalf("first event: %+v, want session %d epoch %d", ev, a.ID(), lda.Epoch())
	}
	b := newSession(t, c.Node(lead), quorumlock.WithTTL(time.Minute))
	type won struct {
		ld  *quorumlock.Leadership
		err error
	}
	electc := make(chan won, 1)
	go func() {
		ld, err := b.Elect(ctx, "sched", []byte("b"))
		electc <- won{ld, err}
	}()
	waitCandidate(t, c.Node(lead), "sched", b.ID())

	c.Isolate(f)
	w := <-electc
	if w.err != nil {
		t.Fatalf("b.Elect: %v", w.err)
	}
	select {
	case <-lda.Done():
	default:
		t.Fatal("the cut-off leadership's Done is open after the next was elected")
	}
	lb := mustAcquire(t, b, "r")
	if lb.Token() <= la.Token() || w.ld.Epoch() <= lda.Epoch() {
		t.Fatalf("grants after the expiry: lock %d (was %d), epoch %d (was %d)", lb.Token(), la.Token(), w.ld.Epoch(), lda.Epoch())
	}
	// Enough entries that every live replica snapshots and compacts past
	// the cut-off follower's log.
	for range 60 {
		if err := mustAcquire(t, b, "filler").Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.ld.Proclaim(ctx, []byte("b2")); err != nil {
		t.Fatal(err)
	}
	c.Heal()

	var seen []quorumlock.LeaderInfo
	last := lda.Epoch()
	for {
		ev := nextEvent(t, events)
		seen = append(seen, ev)
		if ev.Epoch < last {
			t.Fatalf("epoch went back: events %+v", seen)
		}
		last = ev.Epoch
		if ev.HasLeader() && ev.Session != b.ID() && ev.Session != a.ID() {
			t.Fatalf("unknown leader: events %+v", seen)
		}
		if ev.Session == b.ID() && string(ev.Value) == "b2" {
			break
		}
	}
	if seen[0].HasLeader() {
		t.Fatalf("no \"no leader\" event between the two leaderships: %+v", seen)
	}
	if info := holder(t, c.Node(f), "r"); info.Holder != b.ID() || info.Token != lb.Token() {
		t.Fatalf("holder of r on the caught-up follower: %+v", info)
	}
	if !errors.Is(a.Err(), quorumlock.ErrSessionExpired) {
		t.Fatalf("cut-off session after the heal: %v", a.Err())
	}
	if _, err := a.TryAcquire(ctx, "r2"); !errors.Is(err, quorumlock.ErrSessionExpired) {
		t.Fatalf("TryAcquire on the ended session: %v", err)
	}
}

// Review AB. Every replica is stopped (as by a crash) right after a grant
// that falls next to a snapshot (one every 4 entries, so the log behind
// the grant is compacted), and all are restarted on their data, on both
// log backends. A remote client's sessions ride the restart out (it is
// shorter than their TTL): the holder keeps the grant with its token, the
// waiter's blocking Acquire, re-sent with the same (session, seq) to the
// new leader, is still queued and is granted at the release with a larger
// token, which the fence then prefers (invariants 2, 3, 6, 10).
func TestReviewABRestartAllRightAfterGrant(t *testing.T) {
	for _, backend := range []quorumlock.LogBackend{quorumlock.LogPebble, quorumlock.LogWAL} {
		t.Run(string(backend), func(t *testing.T) {
			// The TTL only has to outlast two restarts of the whole
			// cluster: on Pebble under -race the subtest takes 5-8 s
			// (0.9 s without -race, 0.6 s on the WAL), and a 6 s TTL ran
			// out in CI.
			c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 30 * time.Second, Configure: func(cfg *quorumlock.Config) {
				cfg.LogBackend = backend
				cfg.SnapshotEntries = 4
			}})
			c.WaitLeader(5 * time.Second)
			var addrs []string
			for _, a := range c.Peers() {
				addrs = append(addrs, a)
			}
			cl := dial(t, addrs, quorumlock.WithElectionTimeout(c.ElectionTimeout()), quorumlock.WithSessionTTL(30*time.Second))
			ctx := testCtx(t, 60*time.Second)
			s := newSession(t, cl)
			w := newSession(t, cl)
			for i := range 5 {
				if err := mustAcquire(t, s, "filler").Release(ctx); err != nil {
					t.Fatalf("filler %d: %v", i, err)
				}
			}
			l := mustAcquire(t, s, "k")
			type got struct {
				l   *quorumlock.Lock
				err error
			}
			wc := make(chan got, 1)
			go func() {
				lw, err := w.Acquire(ctx, "k")
				wc <- got{lw, err}
			}()
			waitQueued(t, cl, "k", w.ID())

			c.StopAll()
			for _, id := range c.IDs() {
				c.Restart(id)
			}
			lead := c.WaitLeader(10 * time.Second)
			if info := holder(t, c.Node(lead), "k"); info.Holder != s.ID() || info.Token != l.Token() {
				t.Fatalf("after the restart: %+v, want session %d token %d", info, s.ID(), l.Token())
			}
			if err := s.Err(); err != nil {
				t.Fatalf("holder's session after a restart shorter than its TTL: %v", err)
			}
			select {
			case g := <-wc:
				t.Fatalf("waiter answered before the release: %v, %v", g.l, g.err)
			default:
			}
			if err := l.Release(ctx); err != nil {
				t.Fatalf("release after the restart: %v", err)
			}
			g := <-wc
			if g.err != nil {
				t.Fatalf("waiter after the restart: %v", g.err)
			}
			if g.l.Token() <= l.Token() {
				t.Fatalf("waiter's token %d not above %d", g.l.Token(), l.Token())
			}
			fence := quorumlock.NewFence()
			if err := fence.Admit("k", g.l.Token()); err != nil {
				t.Fatal(err)
			}
			if err := fence.Admit("k", l.Token()); !errors.Is(err, quorumlock.ErrStaleToken) {
				t.Fatalf("fence admitted the released grant: %v", err)
			}
			// One more restart with the hand-off in the last snapshot.
			c.StopAll()
			for _, id := range c.IDs() {
				c.Restart(id)
			}
			lead = c.WaitLeader(10 * time.Second)
			if info := holder(t, c.Node(lead), "k"); info.Holder != w.ID() || info.Token != g.l.Token() {
				t.Fatalf("after the second restart: %+v, want session %d token %d", info, w.ID(), g.l.Token())
			}
			l2, err := s.TryAcquire(ctx, "k")
			if !errors.Is(err, quorumlock.ErrLocked) {
				t.Fatalf("TryAcquire of the held lock after the second restart: %v, %v", l2, err)
			}
		})
	}
}

// Review AB. Every replica runs on its own manual clock, advanced together
// in small steps, except that one follower's clock jumps ahead by twice
// the TTL in one step (its process was paused, or its host suspended).
// Only that replica's view of time moves: its session, holding a lock,
// must end at once for its client (the lease counts on the client's own
// clock: invariant 5) and free the lock by its close, so the next waiter
// is granted after the holder's Lost closed and well before a TTL; the
// cluster keeps its leader (the jump is one raft tick, not an election
// timeout of them), and a session on the other follower is untouched.
func TestReviewABOneReplicaClockJumps(t *testing.T) {
	clks := map[uint64]*clock.Manual{}
	for id := uint64(1); id <= 3; id++ {
		// Different readings: only differences of one clock's readings
		// mean anything.
		clks[id] = clock.NewManual(time.Unix(int64(1000*id), 0))
	}
	stop := make(chan struct{})
	driven := make(chan struct{})
	go func() {
		defer close(driven)
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			for _, clk := range clks {
				clk.Advance(time.Millisecond)
			}
		}
	}()
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: testTTL, Configure: func(cfg *quorumlock.Config) {
		cfg.Clock = clks[cfg.ID]
	}})
	t.Cleanup(func() { close(stop); <-driven }) // after c's cleanup (LIFO)
	lead := c.WaitLeader(10 * time.Second)
	f := follower(c, lead)
	other := follower(c, lead, f)
	a := newSession(t, c.Node(f))
	la := mustAcquire(t, a, "r")
	keep := newSession(t, c.Node(other))
	lk := mustAcquire(t, keep, "q")
	b := newSession(t, c.Node(lead))
	type got struct {
		l   *quorumlock.Lock
		at  time.Time
		err error
	}
	bc := make(chan got, 1)
	go func() {
		l, err := b.Acquire(testCtx(t, 30*time.Second), "r")
		bc <- got{l, time.Now(), err}
	}()
	waitQueued(t, c.Node(lead), "r", b.ID())
	term := c.Node(lead).Status().Term

	jumpAt := time.Now()
	clks[f].Advance(2 * testTTL)
	var lostAt time.Time
	select {
	case <-la.Lost():
		lostAt = time.Now()
	case <-time.After(testTTL / 2):
		t.Fatal("the holder on the replica whose clock jumped past its lease still believes it holds the lock")
	}
	if !errors.Is(a.Err(), quorumlock.ErrSessionExpired) {
		t.Fatalf("session on the jumped replica: %v", a.Err())
	}
	g := <-bc
	if g.err != nil {
		t.Fatalf("waiter: %v", g.err)
	}
	if !lostAt.Before(g.at) {
		t.Fatalf("waiter granted %v after the jump, before the holder's Lost at %v", g.at.Sub(jumpAt), lostAt.Sub(jumpAt))
	}
	if g.l.Token() <= la.Token() {
		t.Fatalf("waiter's token %d not above %d", g.l.Token(), la.Token())
	}
	if d := g.at.Sub(jumpAt); d > testTTL/2 {
		t.Fatalf("the lock was freed %v after the jump: the ended session's close did not free it", d)
	}
	if st := c.Node(lead).Status(); st.Leader != lead || st.Term != term {
		t.Fatalf("the jump moved leadership: leader %d term %d, was %d term %d", st.Leader, st.Term, lead, term)
	}
	select {
	case <-lk.Lost():
		t.Fatal("a session on another replica lost its lock")
	default:
	}
	if info := holder(t, c.Node(other), "q"); info.Holder != keep.ID() || info.Token != lk.Token() {
		t.Fatalf("holder of q: %+v", info)
	}
}
