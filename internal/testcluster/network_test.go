package testcluster

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// The Network is tested with plain TCP servers on loopback, one per
// member, registered and dialed the way the cluster does it.

// wait bounds every wait for something that must happen; quiet is how long
// a black-holed direction is watched for data that must not arrive.
const (
	wait  = 5 * time.Second
	quiet = 100 * time.Millisecond
)

// server is a member's listener; the test takes each accepted (raw,
// unfaulted) connection from accepted.
type server struct {
	addr     string
	accepted chan net.Conn
}

func startServer(t *testing.T, nw *Network, id uint64) *server {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	s := &server{addr: lis.Addr().String(), accepted: make(chan net.Conn, 16)}
	nw.register(id, s.addr)
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			s.accepted <- c
		}
	})
	t.Cleanup(func() {
		lis.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return s
}

// connect dials s from member from and returns both ends.
func connect(t *testing.T, nw *Network, from uint64, s *server) (client, srv net.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	client, err := nw.Dialer(from)(ctx, s.addr)
	if err != nil {
		t.Fatalf("dial from %d to %s: %v", from, s.addr, err)
	}
	t.Cleanup(func() { client.Close() })
	select {
	case srv = <-s.accepted:
	case <-time.After(wait):
		t.Fatal("server did not accept")
	}
	return client, srv
}

// errStuck: a call did not return in time.
var errStuck = errors.New("stuck")

// bounded runs f and returns its error, or errStuck if it has not returned
// within d. A call stalled on a cut link ignores deadlines; the connection
// closing at cleanup ends it.
func bounded(d time.Duration, f func() error) error {
	c := make(chan error, 1)
	go func() { c <- f() }()
	select {
	case err := <-c:
		return err
	case <-time.After(d):
		return errStuck
	}
}

func write(w net.Conn, msg string) error {
	return bounded(wait, func() error {
		_, err := w.Write([]byte(msg))
		return err
	})
}

func read1(r net.Conn) error {
	return bounded(wait, func() error {
		_ = r.SetReadDeadline(time.Now().Add(wait)) // fails on a closed connection
		_, err := r.Read(make([]byte, 1))
		return err
	})
}

// send writes msg on w and reads it on r, within wait each.
func send(w, r net.Conn, msg string) error {
	if err := write(w, msg); err != nil {
		return err
	}
	return expect(r, msg, wait)
}

// expect reads len(msg) bytes from r within d and checks them.
func expect(r net.Conn, msg string, d time.Duration) error {
	return bounded(d, func() error {
		_ = r.SetReadDeadline(time.Now().Add(d))
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(r, buf); err != nil {
			return err
		}
		if string(buf) != msg {
			return errors.New("read " + string(buf) + ", want " + msg)
		}
		return nil
	})
}

// isTimeout reports whether err is a deadline expiry.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func newTestNetwork(t *testing.T, members int) (*Network, map[uint64]*server) {
	nw := newNetwork(1)
	servers := make(map[uint64]*server)
	for id := uint64(1); id <= uint64(members); id++ {
		servers[id] = startServer(t, nw, id)
	}
	return nw, servers
}

// dial checks whether from can open a connection to s, and closes it.
func dial(nw *Network, from uint64, s *server) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c, err := nw.Dialer(from)(ctx, s.addr)
	if err != nil {
		return err
	}
	c.Close()
	select {
	case srv := <-s.accepted:
		srv.Close()
	case <-time.After(wait):
		return errors.New("server did not accept")
	}
	return nil
}

func TestNetworkCutFailsDials(t *testing.T) {
	nw, s := newTestNetwork(t, 3)
	nw.Cut(1, 2)
	if err := dial(nw, 1, s[2]); !errors.Is(err, ErrLinkCut) {
		t.Fatalf("dial 1->2 over a cut link = %v, want ErrLinkCut", err)
	}
	// A connection needs both directions, so the reverse dial fails too.
	if err := dial(nw, 2, s[1]); !errors.Is(err, ErrLinkCut) {
		t.Fatalf("dial 2->1 with 1->2 cut = %v, want ErrLinkCut", err)
	}
	if err := dial(nw, 1, s[3]); err != nil {
		t.Fatalf("dial 1->3 (not cut): %v", err)
	}
	nw.Heal()
	c, srv := connect(t, nw, 1, s[2])
	if err := send(c, srv, "healed"); err != nil {
		t.Fatalf("1->2 after Heal: %v", err)
	}
}

func TestNetworkPartition(t *testing.T) {
	nw, s := newTestNetwork(t, 4)
	c12, s12 := connect(t, nw, 1, s[2])
	c31, s31 := connect(t, nw, 3, s[1])
	c23, s23 := connect(t, nw, 2, s[3])
	c14, s14 := connect(t, nw, 1, s[4])

	nw.Partition([]uint64{1}, []uint64{2, 3}) // 4 is in no group

	for name, c := range map[string]net.Conn{"1->2": c12, "3->1": c31} {
		if err := write(c, "x"); err == nil || errors.Is(err, errStuck) {
			t.Errorf("write on crossing connection %s = %v, want it closed", name, err)
		}
		if err := read1(c); err == nil || isTimeout(err) || errors.Is(err, errStuck) {
			t.Errorf("read on crossing connection %s = %v, want it closed", name, err)
		}
	}
	// The far ends see the connection closed.
	for name, c := range map[string]net.Conn{"1->2": s12, "3->1": s31} {
		if err := expect(c, "x", wait); !errors.Is(err, io.EOF) {
			t.Errorf("accepted end of %s: read = %v, want EOF", name, err)
		}
	}
	if err := send(c23, s23, "same group"); err != nil {
		t.Errorf("2->3, same group: %v", err)
	}
	if err := send(s23, c23, "reply"); err != nil {
		t.Errorf("3->2, same group: %v", err)
	}
	if err := send(c14, s14, "no group"); err != nil {
		t.Errorf("1->4, 4 in no group: %v", err)
	}
	if err := dial(nw, 2, s[1]); !errors.Is(err, ErrLinkCut) {
		t.Errorf("new dial 2->1 across the partition = %v, want ErrLinkCut", err)
	}
	if err := dial(nw, 3, s[2]); err != nil {
		t.Errorf("new dial 3->2 inside a group: %v", err)
	}

	nw.Heal()
	c, srv := connect(t, nw, 1, s[2])
	if err := send(c, srv, "healed"); err != nil {
		t.Fatalf("1->2 after Heal: %v", err)
	}
}

func TestNetworkOneWayCut(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to uint64 // the cut link
	}{
		{"dialer to listener", 1, 2},
		{"listener to dialer", 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nw, s := newTestNetwork(t, 2)
			client, srv := connect(t, nw, 1, s[2])
			// Writes of member 1 travel out of client; writes of member 2 out
			// of srv (seen through client's reads).
			stalledW, stalledR, openW, openR := client, srv, srv, client
			if tc.from == 2 {
				stalledW, stalledR, openW, openR = srv, client, client, srv
			}
			nw.Cut(tc.from, tc.to)

			// The write is swallowed (blocks, or is held on the way), so the
			// message does not come out while the link is cut...
			wrote := make(chan error, 1)
			go func() { wrote <- write(stalledW, "held") }()
			got := make(chan error, 1)
			go func() { got <- expect(stalledR, "held", wait) }()
			select {
			case err := <-got:
				t.Fatalf("message crossed the cut link %d->%d (read: %v)", tc.from, tc.to, err)
			case <-time.After(quiet):
			}
			// ...while the other direction still works.
			if err := send(openW, openR, "open"); err != nil {
				t.Fatalf("%d->%d, not cut: %v", tc.to, tc.from, err)
			}

			nw.Heal()
			if err := <-got; err != nil {
				t.Fatalf("after Heal the held message: %v", err)
			}
			if err := <-wrote; err != nil {
				t.Fatalf("held write after Heal: %v", err)
			}
			if err := send(stalledW, stalledR, "again"); err != nil {
				t.Fatalf("%d->%d after Heal: %v", tc.from, tc.to, err)
			}
		})
	}
}

func TestNetworkDelay(t *testing.T) {
	nw, s := newTestNetwork(t, 2)
	client, srv := connect(t, nw, 1, s[2])
	const d = 50 * time.Millisecond
	nw.SetDelay(1, 2, d)
	for range 2 {
		t0 := time.Now()
		if err := send(client, srv, "slow"); err != nil {
			t.Fatalf("delayed 1->2: %v", err)
		}
		if el := time.Since(t0); el < d {
			t.Fatalf("1->2 delivered after %v, want at least %v", el, d)
		}
	}
	nw.SetDelay(2, 1, d) // delays what client reads
	t0 := time.Now()
	if err := send(srv, client, "back"); err != nil {
		t.Fatalf("delayed 2->1: %v", err)
	}
	if el := time.Since(t0); el < d {
		t.Fatalf("2->1 delivered after %v, want at least %v", el, d)
	}
}

func TestNetworkDrop(t *testing.T) {
	t.Run("writes", func(t *testing.T) {
		nw, s := newTestNetwork(t, 2)
		client, srv := connect(t, nw, 1, s[2])
		if err := send(client, srv, "before"); err != nil {
			t.Fatal(err)
		}
		nw.SetDrop(1, 2, 1.0)
		if err := write(client, "lost"); err == nil || errors.Is(err, errStuck) {
			t.Fatalf("write with drop 1.0 = %v, want the connection closed", err)
		}
		if err := read1(client); err == nil || isTimeout(err) || errors.Is(err, errStuck) {
			t.Fatalf("read after the drop = %v, want the connection closed", err)
		}
		if err := expect(srv, "lost", wait); !errors.Is(err, io.EOF) {
			t.Fatalf("far end after the drop: %v, want EOF", err)
		}
	})
	t.Run("reads", func(t *testing.T) {
		nw, s := newTestNetwork(t, 2)
		client, srv := connect(t, nw, 1, s[2])
		nw.SetDrop(2, 1, 1.0)
		if err := write(srv, "lost"); err != nil {
			t.Fatal(err)
		}
		if err := expect(client, "lost", wait); err == nil || isTimeout(err) || errors.Is(err, errStuck) {
			t.Fatalf("read of a dropped message = %v, want the connection closed", err)
		}
	})
	t.Run("zero", func(t *testing.T) {
		nw, s := newTestNetwork(t, 2)
		client, srv := connect(t, nw, 1, s[2])
		nw.SetDrop(1, 2, 0)
		for range 20 {
			if err := send(client, srv, "kept"); err != nil {
				t.Fatalf("drop 0: %v", err)
			}
		}
	})
}

// TestClusterFailover runs the harness end to end: a leader cut off by
// Isolate is replaced, Heal brings it back as a follower, and a stopped
// replica restarts on its address and data and catches up.
func TestClusterFailover(t *testing.T) {
	c := New(t, Options{Size: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := c.WaitLeader(10 * time.Second)
	oldTerm := c.Node(old).Status().Term

	c.Isolate(old)
	var lead uint64
	deadline := time.Now().Add(10 * time.Second)
	for lead = c.Leader(); lead == 0 || lead == old; lead = c.Leader() {
		if time.Now().After(deadline) {
			t.Fatalf("no new leader after isolating %d", old)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if term := c.Node(lead).Status().Term; term <= oldTerm {
		t.Fatalf("new leader %d in term %d, not after the old term %d", lead, term, oldTerm)
	}
	// The majority commits; the isolated replica cannot serve a read.
	if _, err := c.Node(lead).NewSession(ctx); err != nil {
		t.Fatalf("NewSession on the new leader: %v", err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.Node(old).Holder(rctx, "x")
	rcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Holder on the isolated replica = %v, want the context's deadline error", err)
	}

	c.Heal()
	if _, err := c.Node(old).Holder(ctx, "x"); err != nil {
		t.Fatalf("Holder on the healed replica: %v", err)
	}
	if l := c.Node(old).Status().Leader; l == old || l == 0 {
		t.Fatalf("healed replica %d reports leader %d", old, l)
	}

	lead = c.WaitLeader(10 * time.Second)
	var f uint64
	for _, id := range c.IDs() {
		if id != lead {
			f = id
			break
		}
	}
	c.Stop(f)
	if c.Node(f) != nil || len(c.Running()) != 2 {
		t.Fatalf("after Stop(%d): node %v, running %v", f, c.Node(f), c.Running())
	}
	lead = c.WaitLeader(10 * time.Second)
	if _, err := c.Node(lead).NewSession(ctx); err != nil {
		t.Fatalf("NewSession with one replica stopped: %v", err)
	}
	commit := c.Node(lead).Status().Commit

	c.Restart(f)
	if c.Node(f) == nil || len(c.Running()) != 3 {
		t.Fatalf("after Restart(%d): running %v", f, c.Running())
	}
	if _, err := c.Node(f).Holder(ctx, "x"); err != nil {
		t.Fatalf("Holder on the restarted replica: %v", err)
	}
	if a := c.Node(f).Status().Applied; a < commit {
		t.Fatalf("restarted replica applied %d after a linearizable read, below the commit %d before its restart", a, commit)
	}
}
