package quorumlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

const testTTL = 2 * time.Second

// Invariant 5 against invariant 3: the holder on a replica that is cut off
// from the cluster is told it lost the lock before any other session can be
// granted the lock, whether its replica is a follower or the leader.
func TestCutOffHolderLosesLockBeforeRegrant(t *testing.T) {
	t.Parallel()
	for _, where := range []string{"follower", "leader"} {
		t.Run(where, func(t *testing.T) {
			c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: testTTL})
			lead := c.WaitLeader(5 * time.Second)
			x := follower(c, lead)
			if where == "leader" {
				x = lead
			}
			a := newSession(t, c.Node(x))
			la := mustAcquire(t, a, "r")
			other := follower(c, lead, x)
			b := newSession(t, c.Node(other))

			cutAt := time.Now()
			c.Isolate(x)
			granted := make(chan time.Time, 1)
			var lb *quorumlock.Lock
			go func() {
				l, err := b.Acquire(testCtx(t, 30*time.Second), "r")
				if err != nil {
					t.Errorf("b.Acquire: %v", err)
					close(granted)
					return
				}
				lb = l
				granted <- time.Now()
			}()
			var lostAt time.Time
			select {
			case <-la.Lost():
				lostAt = time.Now()
			case <-time.After(3 * testTTL):
				t.Fatal("Lost never fired")
			}
			grantedAt, ok := <-granted
			if !ok {
				return
			}
			if !lostAt.Before(grantedAt) {
				t.Fatalf("lock re-granted at %v, before the cut-off holder was told at %v", grantedAt.Sub(cutAt), lostAt.Sub(cutAt))
			}
			// The send-time rule: nothing sent after the cut was
			// acknowledged, so the belief ended by cut + TTL - margin.
			if limit := cutAt.Add(testTTL - testTTL/10); a.Deadline().After(limit) {
				t.Fatalf("lease deadline %v after cut, beyond TTL-margin %v", a.Deadline().Sub(cutAt), limit.Sub(cutAt))
			}
			if !errors.Is(a.Err(), quorumlock.ErrSessionExpired) || !closed(a.Done()) {
				t.Fatalf("cut-off session: Done closed %v, Err %v", closed(a.Done()), a.Err())
			}
			if lb.Token() <= la.Token() {
				t.Fatalf("new token %d not above %d", lb.Token(), la.Token())
			}
			t.Logf("lost after %v, re-granted after %v", lostAt.Sub(cutAt), grantedAt.Sub(cutAt))
		})
	}
}

// Invariant 4: a leader that is cut off cannot confirm its leadership, so no
// heartbeat it receives after the cut extends its client's belief.
func TestDeposedLeaderDoesNotExtendLease(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: testTTL})
	lead := c.WaitLeader(5 * time.Second)
	a := newSession(t, c.Node(lead))
	before := a.Deadline()
	cutAt := time.Now()
	c.Isolate(lead)
	select {
	case <-a.Done():
	case <-time.After(3 * testTTL):
		t.Fatal("session on the deposed leader never ended")
	}
	if limit := cutAt.Add(testTTL - testTTL/10); a.Deadline().After(limit) {
		t.Fatalf("deadline moved to %v after the cut (limit %v)", a.Deadline().Sub(cutAt), limit.Sub(cutAt))
	}
	if a.Deadline().Before(before) {
		t.Fatal("deadline went backwards")
	}
}

// A leaderless window shorter than the TTL loses no lock and expires no
// session: the new leader gives every session a fresh TTL.
func TestLeaderlessWindowKeepsSessions(t *testing.T) {
	const ttl = 4 * time.Second
	for _, how := range []string{"no-quorum", "leader-stopped"} {
		t.Run(how, func(t *testing.T) {
			c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: ttl})
			lead := c.WaitLeader(5 * time.Second)
			hosts := c.IDs()
			if how == "leader-stopped" {
				hosts = []uint64{follower(c, lead), follower(c, lead, follower(c, lead))}
			}
			var sessions []*quorumlock.Session
			var locks []*quorumlock.Lock
			for i, id := range hosts {
				s := newSession(t, c.Node(id))
				sessions = append(sessions, s)
				locks = append(locks, mustAcquire(t, s, string(rune('a'+i))))
			}
			switch how {
			case "no-quorum":
				c.Net.Partition([]uint64{1}, []uint64{2}, []uint64{3})
				time.Sleep(ttl / 4)
				c.Heal()
			case "leader-stopped":
				c.Stop(lead)
			}
			c.WaitLeader(5 * time.Second)
			// Past one more full TTL: heartbeats must have resumed.
			time.Sleep(ttl + ttl/4)
			for i, s := range sessions {
				if closed(s.Done()) || closed(locks[i].Lost()) {
					t.Fatalf("session %d ended across a short leaderless window: %v", s.ID(), s.Err())
				}
				info := holder(t, c.Node(c.Leader()), locks[i].Name())
				if info.Holder != s.ID() || info.Token != locks[i].Token() {
					t.Fatalf("lock %q changed: %+v, want holder %d token %d", locks[i].Name(), info, s.ID(), locks[i].Token())
				}
			}
		})
	}
}

// Invariant 12: with no quorum every call returns within its context.
func TestCallsReturnWithinContextWithoutQuorum(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 4 * time.Second})
	lead := c.WaitLeader(5 * time.Second)
	x := follower(c, lead)
	n := c.Node(x)
	s := newSession(t, n)
	l := mustAcquire(t, s, "held")
	s2 := newSession(t, n)
	check := cutOffChecker(t, c, x)
	check("Holder", func(ctx context.Context) error { _, err := n.Holder(ctx, "held"); return err }, context.DeadlineExceeded)
	check("NewSession", func(ctx context.Context) error { _, err := n.NewSession(ctx); return err }, context.DeadlineExceeded)
	check("Release", func(ctx context.Context) error { return l.Release(ctx) }, quorumlock.ErrUnknownOutcome)
	check("TryAcquire", func(ctx context.Context) error { _, err := s2.TryAcquire(ctx, "other"); return err }, context.DeadlineExceeded)
	check("Acquire", func(ctx context.Context) error { _, err := s.Acquire(ctx, "new"); return err }, context.DeadlineExceeded)
	check("Close", func(ctx context.Context) error { return s2.Close(ctx) }, quorumlock.ErrUnknownOutcome, quorumlock.ErrSessionExpired)
}
