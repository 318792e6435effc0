package quorumlock_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// waitFor polls cond for up to 10 s of real time.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A remote client over real TCP, its lease on a manual clock (the cluster
// on the real one, with a TTL far above the test's real duration):
// renewals count from the heartbeat's send time, also when the answer is
// held back while the client's clock moves; a black-holed link ends the
// session at exactly its deadline with no call in flight; and the late
// answer that arrives after the link is restored resurrects nothing.
func TestReviewORemoteLeaseOnManualClockThroughProxy(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	p := newTCPProxy(t, c.Peers()[lead])
	clk := clock.NewManual(time.Unix(10_000, 0))
	const ttl = 30 * time.Second
	const life = ttl - ttl/10
	cl := dial(t, []string{p.addr()}, quorumlock.WithClock(clk), quorumlock.WithSessionTTL(ttl))
	defer p.restore() // before the client's Close
	ctx := testCtx(t, 30*time.Second)
	s, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t0 := clk.Now()
	if !s.Deadline().Equal(t0.Add(life)) {
		t.Fatalf("deadline %v, want open + %v", s.Deadline().Sub(t0), life)
	}
	l, err := s.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}

	// A heartbeat answered at once.
	clk.Advance(ttl / 3)
	waitFor(t, "first renewal", func() bool { return s.Deadline().Equal(t0.Add(ttl/3 + life)) })

	// A heartbeat whose answer is held back while the client's clock
	// moves on: the renewal counts from the send.
	p.stallReplies()
	clk.Advance(ttl / 3)
	sent := clk.Now()
	time.Sleep(100 * time.Millisecond) // the heartbeat reaches the leader
	clk.Advance(2 * time.Second)
	p.restore()
	waitFor(t, "second renewal", func() bool { return !s.Deadline().Equal(t0.Add(ttl/3 + life)) })
	if got := s.Deadline(); !got.Equal(sent.Add(life)) {
		t.Fatalf("late answer: deadline send + %v, want send + %v", got.Sub(sent), life)
	}
	deadline := s.Deadline()

	// Black hole: nothing more is acknowledged, nothing is reset.
	p.blackhole()
	clk.Advance(deadline.Sub(clk.Now()) - time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	if closed(s.Done()) || closed(l.Lost()) {
		t.Fatalf("session ended before its deadline: %v", s.Err())
	}
	clk.Advance(time.Millisecond)
	waitFor(t, "lease end", func() bool { return closed(s.Done()) && closed(l.Lost()) })
	if !errors.Is(s.Err(), quorumlock.ErrSessionExpired) {
		t.Fatalf("Err %v", s.Err())
	}

	// The link comes back: the answers held in it arrive, and change
	// nothing.
	p.restore()
	time.Sleep(300 * time.Millisecond)
	if !s.Deadline().Equal(deadline) || !errors.Is(s.Err(), quorumlock.ErrSessionExpired) {
		t.Fatalf("after restore: deadline %v (was %v), Err %v", s.Deadline(), deadline, s.Err())
	}
	if _, err := s.Acquire(ctx, "y"); !errors.Is(err, quorumlock.ErrSessionExpired) {
		t.Fatalf("Acquire on the expired session: %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, quorumlock.ErrSessionExpired) {
		t.Fatalf("Release on the expired session: %v", err)
	}
	if _, err := s.Elect(ctx, "r", nil); !errors.Is(err, quorumlock.ErrSessionExpired) {
		t.Fatalf("Elect on the expired session: %v", err)
	}
	// The application opens a new session; the old one's close (sent in
	// the background) has freed x on the cluster.
	s2, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := s2.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if l2.Token() <= l.Token() {
		t.Fatalf("token %d after %d", l2.Token(), l.Token())
	}
}

// Invariant 1 and 5 against another holder: a remote holder is cut off
// from the cluster (both directions black-holed, its requests stalled, or
// the answers to it stalled); the cluster ends its session and grants the
// lock to a session on a replica. When that grant is made, the first
// holder's Lost has closed: at no moment do both believe they hold it.
func TestReviewOCutOffHolderLostBeforeNextGrant(t *testing.T) {
	for _, fault := range []string{"blackhole", "requests", "replies"} {
		t.Run(fault, func(t *testing.T) {
			c := testcluster.New(t, testcluster.Options{Size: 3})
			lead := c.WaitLeader(5 * time.Second)
			p := newTCPProxy(t, c.Peers()[lead])
			cl := dial(t, []string{p.addr()}, quorumlock.WithSessionTTL(2*time.Second))
			defer p.restore()
			ctx, s, l := remoteHolder(t, cl, 30*time.Second)
			var lostAt time.Time
			lostc := make(chan struct{})
			go func() {
				<-l.Lost()
				lostAt = time.Now()
				close(lostc)
			}()
			other := newSession(t, c.Node(lead))
			switch fault {
			case "blackhole":
				p.blackhole()
			case "requests":
				p.stallRequests()
			case "replies":
				p.stallReplies()
			}
			cut := time.Now()
			ol, err := other.Acquire(ctx, "x")
			granted := time.Now()
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-lostc:
			default:
				t.Fatalf("the lock was granted to another session (token %d) %v after the cut, while the cut-off holder's Lost was still open (deadline in %v)",
					ol.Token(), granted.Sub(cut), time.Until(s.Deadline()))
			}
			if !lostAt.Before(granted) || ol.Token() <= l.Token() {
				t.Fatalf("lost at %v, granted at %v, tokens %d, %d", lostAt.Sub(cut), granted.Sub(cut), l.Token(), ol.Token())
			}
			if !errors.Is(s.Err(), quorumlock.ErrSessionExpired) {
				t.Fatalf("Err %v", s.Err())
			}
			t.Logf("lost %v after the cut, granted %v after", lostAt.Sub(cut), granted.Sub(cut))
		})
	}
}

// Reconnection: faults shorter than the lease (black hole, one direction
// stalled, slow replies, a reset of every connection) cost a remote
// client's session nothing once the link is back: same session, same
// lock, same token, Lost never closed, and it goes on working.
func TestReviewORemoteSessionSurvivesShortFaults(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	p := newTCPProxy(t, c.Peers()[lead])
	const ttl = 2 * time.Second
	cl := dial(t, []string{p.addr()}, quorumlock.WithSessionTTL(ttl))
	defer p.restore()
	ctx, s, l := remoteHolder(t, cl, 50*time.Second)
	faults := []struct {
		name string
		on   func()
		d    time.Duration
	}{
		{"blackhole", p.blackhole, time.Second},
		{"requests", p.stallRequests, time.Second},
		{"replies", p.stallReplies, time.Second},
		{"delay", func() { p.setDelay(300 * time.Millisecond) }, 1500 * time.Millisecond},
		{"reset", p.reset, 0},
		{"reset-blackhole", func() { p.reset(); p.blackhole() }, time.Second},
	}
	for _, f := range faults {
		f.on()
		time.Sleep(f.d)
		p.restore()
		// More than a TTL after the link is back.
		time.Sleep(ttl + ttl/4)
		if err := s.Err(); err != nil {
			t.Fatalf("after %s: the session ended: %v", f.name, err)
		}
		if closed(l.Lost()) {
			t.Fatalf("after %s: Lost closed", f.name)
		}
		info, err := cl.Holder(ctx, "x")
		if err != nil || info.Holder != s.ID() || info.Token != l.Token() {
			t.Fatalf("after %s: Holder %+v, %v; want session %d token %d", f.name, info, err, s.ID(), l.Token())
		}
		if _, err := s.TryAcquire(ctx, "y-"+f.name); err != nil {
			t.Fatalf("after %s: TryAcquire: %v", f.name, err)
		}
	}
}

// proxies puts a tcpProxy in front of every replica of c and returns a
// dialer that reaches each replica's address (as the client knows it, and
// as leader hints name it) through its proxy.
func proxies(t *testing.T, c *testcluster.Cluster) (map[uint64]*tcpProxy, func(context.Context, string) (net.Conn, error)) {
	ps := make(map[uint64]*tcpProxy)
	via := make(map[string]string)
	for id, addr := range c.Peers() {
		ps[id] = newTCPProxy(t, addr)
		via[addr] = ps[id].addr()
	}
	t.Cleanup(func() {
		for _, p := range ps {
			p.restore()
		}
	})
	return ps, func(ctx context.Context, addr string) (net.Conn, error) {
		if a, ok := via[addr]; ok {
			addr = a
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}

// Invariant 12 for a remote client: with every replica black-holed (or
// only the leader), every blocking call returns within a bound of its
// ctx.
func TestReviewORemoteCallsBoundedDuringFaults(t *testing.T) {
	for _, which := range []string{"all", "leader"} {
		t.Run(which, func(t *testing.T) {
			c := testcluster.New(t, testcluster.Options{Size: 3})
			lead := c.WaitLeader(5 * time.Second)
			ps, dialer := proxies(t, c)
			cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithDialer(dialer), quorumlock.WithSessionTTL(5*time.Second))
			_, s, l := remoteHolder(t, cl, 30*time.Second)
			for id, p := range ps {
				if which == "all" || id == lead {
					p.blackhole()
				}
			}
			const short = 300 * time.Millisecond
			calls := []struct {
				name string
				f    func(context.Context) error
			}{
				{"Acquire", func(ctx context.Context) error { _, err := s.Acquire(ctx, "y"); return err }},
				{"TryAcquire", func(ctx context.Context) error { _, err := s.TryAcquire(ctx, "z"); return err }},
				{"Holder", func(ctx context.Context) error { _, err := cl.Holder(ctx, "x"); return err }},
				{"Leader", func(ctx context.Context) error { _, err := cl.Leader(ctx, "r"); return err }},
				{"Elect", func(ctx context.Context) error { _, err := cl.Elect(ctx, "r", nil); return err }},
				{"Session.Elect", func(ctx context.Context) error { _, err := s.Elect(ctx, "r2", nil); return err }},
				{"NewSession", func(ctx context.Context) error { _, err := cl.NewSession(ctx); return err }},
				{"Observe", func(ctx context.Context) error {
					for range cl.Observe(ctx, "r") {
					}
					return nil
				}},
				{"Release", func(ctx context.Context) error { return l.Release(ctx) }},
				{"Close", func(ctx context.Context) error { return s.Close(ctx) }},
			}
			for _, call := range calls {
				cctx, cancel := context.WithTimeout(context.Background(), short)
				done := make(chan error, 1)
				start := time.Now()
				go func() { done <- call.f(cctx) }()
				select {
				case err := <-done:
					t.Logf("%s: %v after %v", call.name, err, time.Since(start))
				case <-time.After(short + 3*time.Second):
					t.Errorf("%s did not return within 3 s of its ctx", call.name)
				}
				cancel()
			}
		})
	}
}

// Leadership moves while the remote client reaches only the old leader
// (the old leader is cut off from the others, the client from the new
// side): the client's lease runs out before the new leader can expire the
// session and grant its lock to another; after the heal the client reports
// the expiry and the application opens a new session that works.
func TestReviewOLeaderMovesAwayFromPartitionedClient(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	ps, dialer := proxies(t, c)
	cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithDialer(dialer), quorumlock.WithSessionTTL(2*time.Second))
	ctx, s, l := remoteHolder(t, cl, 30*time.Second)
	lost := make(chan time.Time, 1)
	go func() { <-l.Lost(); lost <- time.Now() }()
	for id, p := range ps {
		if id != lead {
			p.blackhole()
		}
	}
	c.Isolate(lead)
	b := follower(c, lead)
	var nl uint64
	waitFor(t, "a new leader", func() bool {
		st := c.Node(b).Status()
		nl = st.Leader
		return nl != 0 && nl != lead
	})
	other := newSession(t, c.Node(nl))
	ol, err := other.Acquire(ctx, "x")
	granted := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-lost:
		if !at.Before(granted) {
			t.Fatalf("Lost at %v, after the grant at %v", at, granted)
		}
	default:
		t.Fatalf("lock granted (token %d) to another session while the partitioned holder's Lost was open", ol.Token())
	}
	c.Heal()
	for _, p := range ps {
		p.restore()
	}
	if !errors.Is(s.Err(), quorumlock.ErrSessionExpired) {
		t.Fatalf("Err %v", s.Err())
	}
	s2, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.TryAcquire(ctx, "y"); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.TryAcquire(ctx, "x"); !errors.Is(err, quorumlock.ErrLocked) {
		t.Fatalf("TryAcquire of x held by another: %v", err)
	}
	time.Sleep(3 * time.Second) // more than a TTL: the new session lives on
	if err := s2.Err(); err != nil {
		t.Fatalf("new session ended: %v", err)
	}
}

// Dial with only some addresses reachable (one refusing, one black-holed,
// one a follower), and Dial with a single follower address: the client
// finds the leader, and its session survives the leader's crash.
func TestReviewODialPartialAddresses(t *testing.T) {
	for _, mode := range []string{"mixed", "follower-only"} {
		t.Run(mode, func(t *testing.T) {
			c := testcluster.New(t, testcluster.Options{Size: 3})
			lead := c.WaitLeader(5 * time.Second)
			f := follower(c, lead)
			addrs := []string{c.Peers()[f]}
			if mode == "mixed" {
				addrs = []string{deadAddr(t), silentListener(t).Addr().String(), c.Peers()[f]}
			}
			cl := dial(t, addrs, quorumlock.WithSessionTTL(2*time.Second), quorumlock.WithElectionTimeout(c.ElectionTimeout()))
			ctx, s, l := remoteHolder(t, cl, 30*time.Second)
			time.Sleep(time.Second)
			c.Stop(lead)
			time.Sleep(3 * time.Second)
			if err := s.Err(); err != nil {
				t.Fatalf("session ended after the leader's crash: %v", err)
			}
			info, err := cl.Holder(ctx, "x")
			if err != nil || info.Holder != s.ID() || info.Token != l.Token() || closed(l.Lost()) {
				t.Fatalf("Holder %+v %v, lost %v", info, err, closed(l.Lost()))
			}
		})
	}
}

// A connection that dies silently (a middlebox forgets it: no reset,
// nothing more forwarded) while new connections to the same replica work
// at once: a remote client's session must not be lost for it, and its
// calls must not wait for gRPC's keepalive (10-20 s) to notice. The client
// knows the leader's address only, or every address (only the leader's
// connection dies: a follower's NOT_LEADER hint sends the client back to
// it).
func TestReviewOSilentlyDeadConnectionKeepsSession(t *testing.T) {
	for _, mode := range []string{"one-address", "all-addresses"} {
		t.Run(mode, func(t *testing.T) {
			c := testcluster.New(t, testcluster.Options{Size: 3})
			lead := c.WaitLeader(5 * time.Second)
			ps, dialer := proxies(t, c)
			addrs := addrsOf(c, lead)
			if mode == "all-addresses" {
				addrs = addrsOf(c, c.IDs()...)
			}
			const ttl = 2 * time.Second
			cl := dial(t, addrs, quorumlock.WithDialer(dialer), quorumlock.WithSessionTTL(ttl))
			ctx, s, l := remoteHolder(t, cl, 30*time.Second)
			// The heartbeats alone.
			ps[lead].sever()
			time.Sleep(2 * ttl)
			if err := s.Err(); err != nil {
				t.Fatalf("the session ended: %v", err)
			}
			info, err := cl.Holder(ctx, "x")
			if err != nil || info.Holder != s.ID() || info.Token != l.Token() || closed(l.Lost()) {
				t.Fatalf("Holder %+v %v, lost %v", info, err, closed(l.Lost()))
			}
			// A call gets through well before keepalive would notice
			// the dead connection (its heartbeats dial again).
			ps[lead].sever()
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			if _, err := s.TryAcquire(cctx, "y"); err != nil {
				t.Fatalf("TryAcquire after the connection died: %v", err)
			}
		})
	}
}

// The same for a session on a follower replica: its heartbeats go to the
// leader over the router's own connection, which here dies silently (the
// raft traffic between the two goes on, from the leader's side). The
// session must not be lost while a new connection to the leader works.
func TestReviewOSilentlyDeadRouterConnectionKeepsSession(t *testing.T) {
	c := newPeerLinks(t, 3)
	lead := c.WaitLeader(5 * time.Second)
	f := follower(c.Cluster, lead)
	const ttl = 2 * time.Second
	ctx := testCtx(t, 30*time.Second)
	s, err := c.Node(f).NewSession(ctx, quorumlock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	p := c.link(f, lead)
	p.sever()
	time.Sleep(2 * ttl)
	if err := s.Err(); err != nil {
		t.Fatalf("the session ended: %v", err)
	}
	if closed(l.Lost()) {
		t.Fatal("Lost closed")
	}
	if _, err := s.TryAcquire(ctx, "y"); err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
}

// Invariant 5 for a leadership: a remote leader (Client.Elect) cut off
// from the cluster by a black hole has its Done closed before the next
// candidate, on a replica, is elected.
func TestReviewOCutOffLeaderDoneBeforeNextElected(t *testing.T) {
	t.Parallel()
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	p := newTCPProxy(t, c.Peers()[lead])
	cl := dial(t, []string{p.addr()}, quorumlock.WithSessionTTL(2*time.Second))
	defer p.restore()
	ctx := testCtx(t, 30*time.Second)
	ld, err := cl.Elect(ctx, "sched", []byte("old"))
	if err != nil {
		t.Fatal(err)
	}
	p.blackhole()
	next, err := c.Node(lead).Elect(ctx, "sched", []byte("new"))
	if err != nil {
		t.Fatal(err)
	}
	defer next.Resign(ctx)
	if !closed(ld.Done()) || ld.Context().Err() == nil {
		t.Fatalf("epoch %d elected while the cut-off leader (epoch %d) still had a live Done", next.Epoch(), ld.Epoch())
	}
	if next.Epoch() <= ld.Epoch() {
		t.Fatalf("epoch %d after %d", next.Epoch(), ld.Epoch())
	}
}

// A Client without sessions sends no heartbeats, so its requests are what
// notice a connection to the leader that died without a reset: a request
// attempt unanswered for its whole limit, on a connection that heard
// nothing meanwhile, dials again. Before, NewSession, Holder and every
// other call went back into the dead connection (the
// followers' leader hints name the leader) until gRPC's keepalive gave up
// on it, 10-20 s later.
func TestSilentlyDeadConnectionOfSessionlessClient(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	ps, dialer := proxies(t, c)
	cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithDialer(dialer))
	ctx := testCtx(t, 30*time.Second)
	s, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, call := range []struct {
		name string
		do   func(context.Context) error
	}{
		{"NewSession", func(ctx context.Context) error {
			s, err := cl.NewSession(ctx)
			if err == nil {
				err = s.Close(ctx)
			}
			return err
		}},
		{"Holder", func(ctx context.Context) error { _, err := cl.Holder(ctx, "x"); return err }},
	} {
		ps[lead].sever()
		// dial's attempt limit is twice its 100 ms election timeout:
		// one attempt into the dead connection, then a new one. gRPC's
		// keepalive would take 10-20 s.
		cctx, cancel := context.WithTimeout(ctx, 6*time.Second)
		err := call.do(cctx)
		cancel()
		if err != nil {
			t.Fatalf("%s after the connection to the leader died silently: %v", call.name, err)
		}
	}
}

// remoteHolder opens a session through cl and acquires "x" with it, under
// a test ctx of the given timeout, which it returns.
func remoteHolder(t *testing.T, cl *quorumlock.Client, timeout time.Duration) (context.Context, *quorumlock.Session, *quorumlock.Lock) {
	t.Helper()
	ctx := testCtx(t, timeout)
	s, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	return ctx, s, l
}
