package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// TestCloseHandsLeadershipOver: Close on the leader transfers leadership
// before it stops (Status at return names another leader, one term later),
// and the rest of the cluster serves at once with the lock table intact.
// HardClose does not: the stopped leader stays in its term and, as every
// stopped replica, names no leader rather than itself.
func TestCloseHandsLeadershipOver(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 30 * time.Second})
	lead := c.WaitLeader(10 * time.Second)
	term := c.Node(lead).Status().Term
	f := follower(c, lead)
	s := newSession(t, c.Node(f))
	la := mustAcquire(t, s, "a")

	n := c.Node(lead)
	c.Close(lead)
	st := n.Status()
	if st.Leader == lead || st.Leader == 0 || st.Term != term+1 {
		t.Fatalf("after Close the old leader's view is leader %d, term %d; want another leader in term %d", st.Leader, st.Term, term+1)
	}
	if got := c.WaitLeader(10 * time.Second); got != st.Leader {
		t.Fatalf("the cluster's leader is %d; the old leader handed over to %d", got, st.Leader)
	}
	lb := mustAcquire(t, s, "b")
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d after the hand-over is not above %d", lb.Token(), la.Token())
	}
	if info := holder(t, c.Node(f), "a"); info.Holder != s.ID() || info.Token != la.Token() {
		t.Fatalf("lock a after the hand-over: %+v; want held by %d with token %d", info, s.ID(), la.Token())
	}

	// HardClose: no hand-over. The stopped leader's view names no leader
	// (it never names itself once stopped) and stays in its own term.
	lead2 := st.Leader
	n2 := c.Node(lead2)
	term2 := n2.Status().Term
	c.Stop(lead2)
	if st := n2.Status(); st.Leader != 0 || st.Term != term2 {
		t.Fatalf("after HardClose the leader's last view is leader %d, term %d; want leader 0 in its own term %d", st.Leader, st.Term, term2)
	}
}

// rollingRestart: remote sessions (quorumlock.Dial) hold locks and
// contend on a shared lock while every replica in turn is Closed (a leader
// hands over) and restarted, as in a rolling upgrade. No session may end,
// no lock may be lost, the shared lock is never held twice, tokens strictly
// increase, and every leader's Close hands leadership over. (Written by
// the review of the hand-over.)
func rollingRestart(t *testing.T, size, rounds int) {
	c := testcluster.New(t, testcluster.Options{Size: size})
	c.WaitLeader(10 * time.Second)
	// A TTL of 20 s, not the client's default 10 s: in CI under -race on
	// a slow host (2026-12-02) no heartbeat of the client found a leader
	// for 9 s while the replicas restarted one by one.
	cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithSessionTTL(20*time.Second))
	ctx := testCtx(t, 2*time.Minute)

	var held []*quorumlock.Lock
	for i := range 3 {
		s, err := cl.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l, err := s.Acquire(ctx, fmt.Sprint("own", i))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}

	// Contention on "shared" from 3 more sessions.
	var (
		inside   atomic.Int32
		mu       sync.Mutex
		lastTok  quorumlock.Token
		grants   int
		failures []string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 3 {
		s, err := cl.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				actx, cancel := context.WithTimeout(ctx, 5*time.Second)
				l, err := s.Acquire(actx, "shared")
				cancel()
				if err != nil {
					if errors.Is(err, quorumlock.ErrSessionExpired) || errors.Is(err, quorumlock.ErrClosed) {
						mu.Lock()
						failures = append(failures, fmt.Sprintf("worker %d: session ended: %v", w, err))
						mu.Unlock()
						return
					}
					continue
				}
				if inside.Add(1) != 1 {
					mu.Lock()
					failures = append(failures, "two holders of shared")
					mu.Unlock()
				}
				mu.Lock()
				if l.Token() <= lastTok {
					failures = append(failures, fmt.Sprintf("token %d after %d", l.Token(), lastTok))
				}
				lastTok = l.Token()
				grants++
				mu.Unlock()
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				if err := l.Release(rctx); err != nil && !errors.Is(err, quorumlock.ErrNotHeld) {
					// an ambiguous release is settled by a retry of the same seq
					_ = err
				}
				cancel()
			}
		}()
	}

	handedOver, wasLeader := 0, 0
	for r := range rounds {
		for _, id := range c.IDs() {
			n := c.Node(id)
			lead := n.Status().Leader == id
			c.Close(id)
			if lead {
				wasLeader++
				if st := n.Status(); st.Leader != id && st.Leader != 0 {
					handedOver++
				} else {
					t.Errorf("round %d: leader %d closed without handing over", r, id)
				}
			}
			time.Sleep(50 * time.Millisecond)
			c.Restart(id)
			c.WaitLeader(10 * time.Second)
			time.Sleep(200 * time.Millisecond) // let it catch up
		}
	}
	close(stop)
	wg.Wait()
	for _, l := range held {
		select {
		case <-l.Lost():
			t.Errorf("lock %s of session %d lost during the rolling restart: %v", l.Name(), l.Session().ID(), l.Session().Err())
		default:
		}
		info, err := cl.Holder(ctx, l.Name())
		if err != nil {
			t.Fatal(err)
		}
		if info.Holder != l.Session().ID() || info.Token != l.Token() {
			t.Errorf("lock %s after rolling restart: %+v; want held by %d token %d", l.Name(), info, l.Session().ID(), l.Token())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, f := range failures {
		t.Error(f)
	}
	t.Logf("%d grants of shared; %d of %d leader closes handed over", grants, handedOver, wasLeader)
	if grants == 0 {
		t.Error("no grants of shared")
	}
}

func TestRollingRestartRemote(t *testing.T) { rollingRestart(t, 3, 2) }

// TestCloseAfterFollowerCrash: 5 replicas; a follower crashes and the
// leader is closed right after, within an election timeout (a replica
// crash during a rolling restart). The crashed voter (equal log, lowest
// ID, still RecentActive in raft) must not be the transferee: the hand-over
// goes to a live replica. (Found by review.)
func TestCloseAfterFollowerCrash(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 5, TickInterval: 20 * time.Millisecond})
	lead := c.WaitLeader(10 * time.Second)
	s := newSession(t, c.Node(follower(c, lead)))
	mustAcquire(t, s, "warm")
	time.Sleep(100 * time.Millisecond)
	down := follower(c, lead) // the lowest follower ID
	for _, id := range c.IDs() {
		if id != lead {
			down = id
			break
		}
	}
	c.Stop(down)
	n := c.Node(lead)
	c.Close(lead)
	if st := n.Status(); st.Leader == lead || st.Leader == 0 || st.Leader == down {
		t.Fatalf("Close of leader %d with replica %d just crashed did not hand over to a live replica (view: leader %d)", lead, down, st.Leader)
	}
}

// TestCloseConcurrentAndTwice: Close racing HardClose and a second Close
// on the leader: every call returns nil and the cluster goes on.
func TestCloseConcurrentAndTwice(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(10 * time.Second)
	n := c.Node(lead)
	s := newSession(t, c.Node(follower(c, lead)))
	mustAcquire(t, s, "a")
	var wg sync.WaitGroup
	for i, f := range []func() error{n.Close, n.HardClose, n.Close} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				t.Errorf("call %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	// the cluster goes on
	c.WaitLeader(10 * time.Second)
	mustAcquire(t, s, "b")
}
