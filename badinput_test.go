package quorumlock_test

// Bad-input review: each test here failed on the code it was written
// against; see the report for root causes.

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// A raw OPEN_SESSION with an absurd ttl_ms (negative, ~-9 million years)
// must be refused with CODE_INVALID. The server multiplies ttl_ms by
// time.Millisecond without an overflow check, so a value chosen to wrap
// lands inside [1 s, 10 min] and opens a session.
func TestBadInputOpenSessionTTLOverflowRejected(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	cli := dialLeader(t, c.Node(lead))
	for _, ttlMs := range []int64{5000 - 1<<58, 5000 + 1<<58, -1, 0, 999, 600_001} {
		resp, err := cli.Propose(testCtx(t, 5*time.Second), &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: ttlMs})
		if err != nil {
			t.Fatalf("ttl_ms %d: %v", ttlMs, err)
		}
		if resp.GetCode() != lockpb.Code_CODE_INVALID {
			t.Errorf("OPEN_SESSION ttl_ms=%d: code %v session %d, want CODE_INVALID", ttlMs, resp.GetCode(), resp.GetSession())
		}
	}
}

// Dial documents ErrInvalidConfig for bad options. A negative or zero
// election timeout makes every attempt's deadline already past.
func TestBadInputDialBadElectionTimeout(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	lead := c.WaitLeader(5 * time.Second)
	addr := c.Node(lead).Addr().String()
	for _, d := range []time.Duration{-time.Second, 0} {
		cl, err := quorumlock.Dial(testCtx(t, 5*time.Second), []string{addr}, quorumlock.WithElectionTimeout(d))
		if err == nil {
			cl.Close()
		}
		if !errors.Is(err, quorumlock.ErrInvalidConfig) {
			t.Errorf("Dial with WithElectionTimeout(%v): %v, want ErrInvalidConfig", d, err)
		}
	}
}

// WithClock(nil) is a bad option: Dial must refuse it (ErrInvalidConfig)
// or fall back to the real clock, not panic.
func TestBadInputDialNilClock(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	lead := c.WaitLeader(5 * time.Second)
	addr := c.Node(lead).Addr().String()
	var cl *quorumlock.Client
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Dial(WithClock(nil)) panicked: %v", r)
			}
		}()
		cl, err = quorumlock.Dial(testCtx(t, 5*time.Second), []string{addr}, quorumlock.WithClock(nil))
	}()
	if err != nil {
		if !errors.Is(err, quorumlock.ErrInvalidConfig) {
			t.Fatalf("Dial(WithClock(nil)): %v, want ErrInvalidConfig", err)
		}
		return
	}
	defer cl.Close()
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("NewSession after Dial(WithClock(nil)) panicked: %v", r)
			}
		}()
		s, err := cl.NewSession(testCtx(t, 5*time.Second))
		if err == nil {
			s.Close(context.Background())
		}
	}()
}

// Config.TickInterval x ElectionTicks overflowing time.Duration slips past
// validate (the election-timeout check sees a wrapped value) and Start
// accepts an absurd config instead of naming the field.
func TestBadInputConfigTickOverflow(t *testing.T) {
	for _, tc := range []struct {
		tick  time.Duration
		ticks int
	}{
		{1 << 62, 4},         // 2^64 ns wraps to 0
		{time.Hour, 1 << 62}, // wraps
		{time.Millisecond, 1 << 62},
	} {
		cfg := quorumlock.Config{
			ID:            1,
			Peers:         map[uint64]string{1: "127.0.0.1:1"},
			DataDir:       t.TempDir(),
			TickInterval:  tc.tick,
			ElectionTicks: tc.ticks,
		}
		cfg.Listener = mustListen(t)
		cfg.Peers[1] = cfg.Listener.Addr().String()
		n, err := quorumlock.Start(testCtx(t, 5*time.Second), cfg)
		if err == nil {
			n.HardClose()
			t.Errorf("Start with TickInterval %v x ElectionTicks %d: accepted, want ErrInvalidConfig", tc.tick, tc.ticks)
			continue
		}
		if !errors.Is(err, quorumlock.ErrInvalidConfig) {
			t.Errorf("Start with TickInterval %v x ElectionTicks %d: %v, want ErrInvalidConfig", tc.tick, tc.ticks, err)
		}
	}
}

func mustListen(t *testing.T) net.Listener {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis
}

// Every call on a Client after Close returns ErrClosed (and opens nothing).
func TestBadInputClientCallsAfterClose(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	lead := c.WaitLeader(5 * time.Second)
	addr := c.Node(lead).Addr().String()
	cl, err := quorumlock.Dial(testCtx(t, 5*time.Second), []string{addr})
	if err != nil {
		t.Fatal(err)
	}
	cl.Close()
	ctx := testCtx(t, 3*time.Second)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, quorumlock.ErrClosed) {
			t.Errorf("%s after Client.Close: %v, want ErrClosed", what, err)
		}
	}
	_, err = cl.NewSession(ctx)
	check("NewSession", err)
	_, err = cl.Holder(ctx, "x")
	check("Holder", err)
	_, err = cl.Leader(ctx, "x")
	check("Leader", err)
	_, _, err = cl.Locks(ctx, "", 0)
	check("Locks", err)
	_, _, err = cl.Sessions(ctx, 0, 0)
	check("Sessions", err)
	check("RevokeSession", cl.RevokeSession(ctx, 1))
	for _, st := range cl.Status(ctx) {
		check("Status("+st.Addr+")", st.Err)
	}
}

// Every call on a Node (and its sessions, locks, leaderships) after
// HardClose returns a sentinel error promptly.
func TestBadInputNodeCallsAfterClose(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	lead := c.WaitLeader(5 * time.Second)
	n := c.Node(lead)
	s := newSession(t, n)
	l := mustAcquire(t, s, "a")
	ld, err := s.Elect(testCtx(t, 5*time.Second), "r", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	c.Stop(lead)
	ctx := testCtx(t, 3*time.Second)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, quorumlock.ErrClosed) && !errors.Is(err, quorumlock.ErrSessionExpired) {
			t.Errorf("%s after HardClose: %v, want ErrClosed or ErrSessionExpired", what, err)
		}
	}
	_, err = n.NewSession(ctx)
	check("NewSession", err)
	_, err = n.Holder(ctx, "a")
	check("Holder", err)
	_, err = n.Leader(ctx, "r")
	check("Leader", err)
	_, err = n.Elect(ctx, "r2", nil)
	check("Node.Elect", err)
	if _, ok := <-n.Observe(ctx, "r"); ok {
		t.Errorf("Observe after HardClose delivered an event")
	}
	_, err = s.Acquire(ctx, "b")
	check("Acquire", err)
	_, err = s.TryAcquire(ctx, "b")
	check("TryAcquire", err)
	_, err = s.Elect(ctx, "r3", nil)
	check("Session.Elect", err)
	check("Release", l.Release(ctx))
	check("Proclaim", ld.Proclaim(ctx, []byte("w")))
	check("Resign", ld.Resign(ctx))
	check("Session.Close", s.Close(ctx))
	if ctx.Err() != nil {
		t.Errorf("calls after HardClose ran into the test's deadline")
	}
}

// A zero Fence (declared, not made by NewFence) must not panic: Admit
// writes to a nil map.
func TestBadInputZeroFence(t *testing.T) {
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Admit on a zero Fence panicked: %v", r)
		}
	}()
	var f quorumlock.Fence
	if err := f.Admit("r", 5); err != nil {
		t.Fatal(err)
	}
	if err := f.Admit("r", 4); !errors.Is(err, quorumlock.ErrStaleToken) {
		t.Fatalf("stale token on a zero Fence: %v", err)
	}
}

// Two members whose addresses differ only in how the port is spelled
// ("7000" and "07000") share an address; validate compares the raw port
// strings.
func TestBadInputConfigPeersSameAddressDifferentSpelling(t *testing.T) {
	lis := mustListen(t)
	_, port, _ := net.SplitHostPort(lis.Addr().String())
	cfg := quorumlock.Config{
		ID:       1,
		Peers:    map[uint64]string{1: lis.Addr().String(), 2: "127.0.0.1:0" + port, 3: "127.0.0.1:+" + port},
		DataDir:  t.TempDir(),
		Listener: lis,
	}
	n, err := quorumlock.Start(testCtx(t, 5*time.Second), cfg)
	if err == nil {
		n.HardClose()
	}
	if !errors.Is(err, quorumlock.ErrInvalidConfig) {
		t.Fatalf("Peers %v: %v, want ErrInvalidConfig naming Peers", cfg.Peers, err)
	}
}

// An address without a port is refused by Dial (gRPC would dial port 443
// of that host, or fail much later with a resolver error); with a dialer of
// its own the caller may use any form.
func TestDialAddressWithoutPort(t *testing.T) {
	for _, addr := range []string{"localhost", "nonsense", "127.0.0.1", "[::1]", "127.0.0.1:"} {
		cl, err := quorumlock.Dial(testCtx(t, 5*time.Second), []string{addr})
		if !errors.Is(err, quorumlock.ErrInvalidConfig) {
			if cl != nil {
				cl.Close()
			}
			t.Errorf("Dial(%q) = %v, want ErrInvalidConfig", addr, err)
		}
	}
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		return nil, errors.New("no network here")
	}
	_, err := quorumlock.Dial(testCtx(t, 5*time.Second), []string{"replica-a"}, quorumlock.WithDialer(dialer))
	if err == nil || errors.Is(err, quorumlock.ErrInvalidConfig) {
		t.Fatalf("Dial with a dialer: %v, want the dialer's failure", err)
	}
}

// gRPC target names with a scheme ("dns:///host:port" for a name with
// several addresses, "passthrough:///host:port", "unix:///path") are not
// host:port but are what gRPC users write; Dial takes them, and still
// refuses a dns target without a port (gRPC would dial port 443).
func TestDialGRPCTargetForms(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	lead := c.WaitLeader(5 * time.Second)
	addr := c.Node(lead).Addr().String()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"dns:///" + addr, "passthrough:///" + addr, "localhost:" + port} {
		cl, err := quorumlock.Dial(testCtx(t, 5*time.Second), []string{target})
		if err != nil {
			t.Errorf("Dial(%q): %v", target, err)
			continue
		}
		if _, err := cl.Holder(testCtx(t, 5*time.Second), "x"); err != nil {
			t.Errorf("Holder through %q: %v", target, err)
		}
		cl.Close()
	}
	for _, target := range []string{"dns:///localhost", "dns:///127.0.0.1:"} {
		cl, err := quorumlock.Dial(testCtx(t, 5*time.Second), []string{target})
		if !errors.Is(err, quorumlock.ErrInvalidConfig) {
			if cl != nil {
				cl.Close()
			}
			t.Errorf("Dial(%q) = %v, want ErrInvalidConfig", target, err)
		}
	}
}
