package quorumlock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// An Acquire whose ctx ends while it waits has a definite outcome: it
// returns the grant, or ctx's error with the session out of the queue;
// never both, never unknown.
func TestAcquireCancelledWhileWaitingIsDefinite(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	h := newSession(t, c.Node(lead))
	w := newSession(t, c.Node(follower(c, lead)))

	hl := mustAcquire(t, h, "c")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := w.Acquire(ctx, "c")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire behind a holder: %v, want DeadlineExceeded", err)
	}
	if info := leftLock(t, c.Node(lead), "c", w.ID(), err); slices.Contains(info.Waiters, w.ID()) {
		t.Fatalf("withdrawn waiter still queued: %+v", info)
	}
	if err := hl.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if info := holder(t, c.Node(lead), "c"); info.Holder != 0 {
		t.Fatalf("lock went to %d after the only waiter withdrew", info.Holder)
	}
	if closed(w.Done()) {
		t.Fatalf("session ended by a withdrawal: %v", w.Err())
	}

	// Race the release against the deadline: either outcome is fine, but it
	// must be the one the table shows.
	rnd := rand.New(rand.NewPCG(7, 7))
	var granted, withdrawn int
	for i := range 20 {
		hl := mustAcquire(t, h, "c")
		done := make(chan struct{})
		var wl *quorumlock.Lock
		var werr error
		go func() {
			defer close(done)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
			defer cancel()
			wl, werr = w.Acquire(ctx, "c")
		}()
		time.Sleep(time.Duration(rnd.IntN(80)) * time.Millisecond)
		if err := hl.Release(testCtx(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		<-done
		info := holder(t, c.Node(lead), "c")
		switch {
		case werr == nil:
			granted++
			if info.Holder != w.ID() || info.Token != wl.Token() || wl.Token() <= hl.Token() {
				t.Fatalf("round %d: Acquire returned token %d but the table says %+v", i, wl.Token(), info)
			}
			if err := wl.Release(testCtx(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
		case errors.Is(werr, quorumlock.ErrSessionExpired):
			// The withdrawal could not be confirmed in time (a loaded
			// machine): the session was abandoned, which is definite too.
			// Its grant dies with it.
			if !closed(w.Done()) {
				t.Fatalf("round %d: %v but the session is alive", i, werr)
			}
			deadline := time.Now().Add(10 * time.Second)
			for holder(t, c.Node(lead), "c").Holder == w.ID() {
				if time.Now().After(deadline) {
					t.Fatalf("round %d: abandoned session still holds the lock", i)
				}
				time.Sleep(10 * time.Millisecond)
			}
			w = newSession(t, c.Node(follower(c, lead)))
		case errors.Is(werr, context.DeadlineExceeded):
			withdrawn++
			if info = leftLock(t, c.Node(lead), "c", w.ID(), werr); info.Holder == w.ID() || slices.Contains(info.Waiters, w.ID()) {
				t.Fatalf("round %d: Acquire failed (%v) but the table says %+v", i, werr, info)
			}
		default:
			t.Fatalf("round %d: %v", i, werr)
		}
	}
	t.Logf("granted %d, withdrawn %d", granted, withdrawn)
}

// leftLock returns name's table after an Acquire of session returned
// err, ctx's error. Unless err wraps ErrWithdrawPending, the withdrawal
// was answered within ctx and the table is read at once; with it (on a
// loaded machine the withdrawal may go on in the background for a moment,
// and a grant that won the race is then released), once session is
// neither its holder nor among its waiters, or after 2 s.
func leftLock(t *testing.T, n *quorumlock.Node, name string, session uint64, err error) quorumlock.LockInfo {
	t.Helper()
	if !errors.Is(err, quorumlock.ErrWithdrawPending) {
		return holder(t, n, name)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		info := holder(t, n, name)
		if (info.Holder != session && !slices.Contains(info.Waiters, session)) || time.Now().After(deadline) {
			return info
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func dialLeader(t *testing.T, n *quorumlock.Node) lockpb.LockClient {
	t.Helper()
	cc, err := grpc.NewClient(n.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return lockpb.NewLockClient(cc)
}

// Invariant 6: a request re-sent with the same (session, seq) takes effect
// once and returns the original outcome; invariant 7: a replayed release
// never frees a newer grant.
func TestRetriedRequestTakesEffectOnce(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	a := newSession(t, c.Node(lead)) // kept alive by its heartbeats
	b := newSession(t, c.Node(lead))
	cli := dialLeader(t, c.Node(lead))
	ctx := testCtx(t, 10*time.Second)
	// Sequence numbers far above the ones the Session itself uses.
	acq := &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a.ID(), Seq: 1000, Done: 1000, Name: "d"}
	r1, err := cli.Propose(ctx, acq)
	if err != nil || r1.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("acquire: %v %v", r1, err)
	}
	r2, err := cli.Propose(ctx, acq)
	if err != nil || r2.GetCode() != lockpb.Code_CODE_OK || r2.GetToken() != r1.GetToken() {
		t.Fatalf("retried acquire: %v %v, want token %d", r2, err, r1.GetToken())
	}
	commit := c.Node(lead).Status().Commit
	rel := &lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: a.ID(), Seq: 1001, Done: 1000, Name: "d", Token: r1.GetToken()}
	if r, err := cli.Propose(ctx, rel); err != nil || r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("release: %v %v", r, err)
	}
	lb := mustAcquire(t, b, "d")
	for _, req := range []*lockpb.Request{rel, acq} {
		r, err := cli.Propose(ctx, req)
		if err != nil || r.GetCode() != lockpb.Code_CODE_OK {
			t.Fatalf("replayed %v: %v %v", req.GetOp(), r, err)
		}
	}
	if info := holder(t, c.Node(lead), "d"); info.Holder != b.ID() || info.Token != lb.Token() {
		t.Fatalf("a replayed request changed the newer grant: %+v", info)
	}
	if c.Node(lead).Status().Commit <= commit {
		t.Fatal("commit index did not move")
	}

	// A follower redirects.
	f := follower(c, lead)
	r, err := dialLeader(t, c.Node(f)).Propose(ctx, acq)
	if err != nil || r.GetCode() != lockpb.Code_CODE_NOT_LEADER || r.GetLeaderHint() != lead {
		t.Fatalf("follower answered %v %v, want NOT_LEADER hint %d", r, err, lead)
	}
}

// A waiter whose leader dies is re-sent to the new leader with the same
// (session, seq): it stays queued exactly once and is granted once.
func TestWaiterSurvivesLeaderLoss(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	f1 := follower(c, lead)
	f2 := follower(c, lead, f1)
	h := newSession(t, c.Node(f1))
	w := newSession(t, c.Node(f2))
	hl := mustAcquire(t, h, "m")
	got := make(chan *quorumlock.Lock, 1)
	go func() {
		l, err := w.Acquire(testCtx(t, 20*time.Second), "m")
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		got <- l
	}()
	waitQueued(t, c.Node(f1), "m", w.ID())
	c.Stop(lead)
	newLead := c.WaitLeader(5 * time.Second)
	// Give the waiter's router time to re-send to the new leader.
	time.Sleep(200 * time.Millisecond)
	info := holder(t, c.Node(newLead), "m")
	if info.Holder != h.ID() || !slices.Equal(info.Waiters, []uint64{w.ID()}) {
		t.Fatalf("table after failover: %+v", info)
	}
	if err := hl.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	wl := <-got
	if wl == nil || wl.Token() <= hl.Token() {
		t.Fatalf("waiter not granted with a larger token: %v", wl)
	}
	if info := holder(t, c.Node(newLead), "m"); info.Holder != w.ID() || len(info.Waiters) != 0 {
		t.Fatalf("table after hand-off: %+v", info)
	}
}

// Invariant 2: tokens strictly increase across a leader stop and a restart
// of every replica; the lock table survives the restart.
func TestTokensIncreaseAcrossRestarts(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	var tokens []quorumlock.Token
	cycle := func(n *quorumlock.Node) {
		t.Helper()
		s := newSession(t, n)
		for range 3 {
			l := mustAcquire(t, s, "t")
			tokens = append(tokens, l.Token())
			if err := l.Release(testCtx(t, 5*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(testCtx(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	lead := c.WaitLeader(5 * time.Second)
	cycle(c.Node(follower(c, lead)))
	c.Stop(lead)
	newLead := c.WaitLeader(5 * time.Second)
	cycle(c.Node(newLead))
	c.Restart(lead)
	cycle(c.Node(lead))

	keeper := newSession(t, c.Node(lead))
	kept := mustAcquire(t, keeper, "kept")
	c.StopAll()
	for _, id := range c.IDs() {
		c.Restart(id)
	}
	lead = c.WaitLeader(5 * time.Second)
	if info := holder(t, c.Node(lead), "kept"); info.Holder != keeper.ID() || info.Token != kept.Token() {
		t.Fatalf("lock table after a full restart: %+v, want holder %d token %d", info, keeper.ID(), kept.Token())
	}
	cycle(c.Node(lead))
	// The holder's replica went away with the restart: its session expires
	// and the next grant of the lock has a larger token.
	s := newSession(t, c.Node(lead))
	next := mustAcquire(t, s, "kept")
	if next.Token() <= kept.Token() {
		t.Fatalf("token %d after expiry not above %d", next.Token(), kept.Token())
	}
	tokens = append(tokens, next.Token())
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("tokens not increasing: %v", tokens)
		}
	}
}
