package quorumlock_test

import (
	"context"
	"crypto/tls"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
)

// Probes of the root package's docstrings: each subtest checks one
// documented default, error or bound on a real 3-replica cluster.
func TestReviewIDocClaims(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := nodes[specLeader(t, nodes)]
	cl := specDial(t, nodes)
	ctx := testCtx(t, 60*time.Second)

	// Session.Acquire: "Acquiring a lock the session already holds returns
	// the same grant"; TryAcquire likewise, and ErrLocked for another
	// session's lock. Session.Locks is sorted by name and leaves roles out.
	t.Run("AcquireHeldReturnsSameGrant", func(t *testing.T) {
		for _, o := range []opener{lead, cl} {
			s := specSession(ctx, t, o)
			b := mustAcquire(t, s, "probe-i/b")
			a := mustAcquire(t, s, "probe-i/a")
			again, err := s.Acquire(ctx, "probe-i/b")
			if err != nil || again.Token() != b.Token() {
				t.Errorf("%s: Acquire of a held lock: %v token %v, want token %d", where(o), err, again, b.Token())
			}
			try, err := s.TryAcquire(ctx, "probe-i/a")
			if err != nil || try.Token() != a.Token() {
				t.Errorf("%s: TryAcquire of a held lock: %v, want token %d", where(o), err, a.Token())
			}
			other := specSession(ctx, t, o)
			if _, err := other.TryAcquire(ctx, "probe-i/a"); !errors.Is(err, quorumlock.ErrLocked) {
				t.Errorf("%s: TryAcquire of another session's lock: %v, want ErrLocked", where(o), err)
			}
			if _, err := s.Elect(ctx, "probe-i/role", nil); err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, l := range s.Locks() {
				names = append(names, l.Name())
			}
			if strings.Join(names, ",") != "probe-i/a,probe-i/b" {
				t.Errorf("%s: Locks() = %q, want probe-i/a,probe-i/b", where(o), names)
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})

	// ErrInvalidName: empty, NUL, invalid UTF-8, longer than MaxNameBytes
	// (256 by default); exactly 256 bytes is accepted. On a Client the
	// length bound is the cluster's.
	t.Run("Names", func(t *testing.T) {
		for _, o := range []opener{lead, cl} {
			s := specSession(ctx, t, o)
			for _, bad := range []string{"", "a\x00b", "\xff", strings.Repeat("x", 257)} {
				if _, err := s.Acquire(ctx, bad); !errors.Is(err, quorumlock.ErrInvalidName) {
					t.Errorf("%s: Acquire(%q...): %v, want ErrInvalidName", where(o), bad[:min(len(bad), 8)], err)
				}
				if _, err := o.Holder(ctx, bad); !errors.Is(err, quorumlock.ErrInvalidName) {
					t.Errorf("%s: Holder(%q...): %v, want ErrInvalidName", where(o), bad[:min(len(bad), 8)], err)
				}
				if _, err := o.Leader(ctx, bad); !errors.Is(err, quorumlock.ErrInvalidName) {
					t.Errorf("%s: Leader(%q...): %v, want ErrInvalidName", where(o), bad[:min(len(bad), 8)], err)
				}
				if _, open := <-o.Observe(ctx, bad); open {
					t.Errorf("%s: Observe(%q...) delivered an event, want the channel closed at once", where(o), bad[:min(len(bad), 8)])
				}
			}
			if _, err := s.Acquire(ctx, where(o)+strings.Repeat("y", 256-len(where(o)))); err != nil {
				t.Errorf("%s: a name of 256 bytes: %v", where(o), err)
			}
		}
	})

	// WithTTL outside [1 s, 10 min] is ErrInvalidTTL; a nil option is
	// ignored; Session.TTL reports the TTL and Deadline is about
	// TTL - TTL/10 ahead.
	t.Run("TTL", func(t *testing.T) {
		for _, o := range []opener{lead, cl} {
			for _, d := range []time.Duration{999 * time.Millisecond, 10*time.Minute + 1, -time.Second} {
				if _, err := o.NewSession(ctx, quorumlock.WithTTL(d)); !errors.Is(err, quorumlock.ErrInvalidTTL) {
					t.Errorf("%s: WithTTL(%v): %v, want ErrInvalidTTL", where(o), d, err)
				}
			}
			before := time.Now()
			s := specSession(ctx, t, o, nil, quorumlock.WithTTL(5*time.Second))
			if s.TTL() != 5*time.Second {
				t.Errorf("%s: TTL() = %v, want 5s", where(o), s.TTL())
			}
			if d := s.Deadline().Sub(before); d > 4600*time.Millisecond || d < 3*time.Second {
				t.Errorf("%s: Deadline %v after the call, want about 4.5s (TTL - TTL/10)", where(o), d)
			}
		}
	})

	// Release twice: ErrNotHeld, Lost closed. Close twice: nil; calls after
	// Close: ErrSessionExpired.
	t.Run("ReleaseAndClose", func(t *testing.T) {
		for _, o := range []opener{lead, cl} {
			s := specSession(ctx, t, o)
			l := mustAcquire(t, s, "probe-i/rel")
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if !closed(l.Lost()) {
				t.Errorf("%s: Lost open after Release", where(o))
			}
			if err := l.Release(ctx); !errors.Is(err, quorumlock.ErrNotHeld) {
				t.Errorf("%s: second Release: %v, want ErrNotHeld", where(o), err)
			}
			if err := s.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(ctx); err != nil {
				t.Errorf("%s: second Close: %v, want nil", where(o), err)
			}
			if _, err := s.Acquire(ctx, "probe-i/rel"); !errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Errorf("%s: Acquire after Close: %v, want ErrSessionExpired", where(o), err)
			}
			if err := s.Err(); !errors.Is(err, quorumlock.ErrSessionExpired) {
				t.Errorf("%s: Err after Close: %v, want ErrSessionExpired", where(o), err)
			}
		}
	})

	// Elections: MaxValueBytes (4,096) is the bound for Elect and Proclaim
	// (ErrLimit above it); a second Session.Elect returns the same
	// *Leadership with its value unchanged; Resign twice with Session.Elect
	// gives ErrNotHeld, with Node.Elect and Client.Elect nil; Proclaim
	// after Resign is ErrNotHeld; Leader of a role without one is
	// ErrNoLeader.
	t.Run("Elections", func(t *testing.T) {
		for _, o := range []opener{lead, cl} {
			s := specSession(ctx, t, o)
			big := make([]byte, quorumlock.MaxValueBytes+1)
			if _, err := s.Elect(ctx, "probe-i/e", big); !errors.Is(err, quorumlock.ErrLimit) {
				t.Errorf("%s: Elect with %d bytes: %v, want ErrLimit", where(o), len(big), err)
			}
			ld, err := s.Elect(ctx, "probe-i/e", []byte("one"))
			if err != nil {
				t.Fatal(err)
			}
			ld2, err := s.Elect(ctx, "probe-i/e", []byte("two"))
			if err != nil || ld2 != ld {
				t.Errorf("%s: second Elect: %p %v, want the same *Leadership %p", where(o), ld2, err, ld)
			}
			if info, err := o.Leader(ctx, "probe-i/e"); err != nil || string(info.Value) != "one" || info.Epoch != ld.Epoch() {
				t.Errorf("%s: Leader after a second Elect: %+v %v, want value \"one\" epoch %d", where(o), info, err, ld.Epoch())
			}
			if err := ld.Proclaim(ctx, big); !errors.Is(err, quorumlock.ErrLimit) {
				t.Errorf("%s: Proclaim with %d bytes: %v, want ErrLimit", where(o), len(big), err)
			}
			if err := ld.Proclaim(ctx, big[:quorumlock.MaxValueBytes]); err != nil {
				t.Errorf("%s: Proclaim with %d bytes: %v", where(o), quorumlock.MaxValueBytes, err)
			}
			if err := ld.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			if !closed(ld.Done()) || ld.Context().Err() == nil {
				t.Errorf("%s: Done/Context open after Resign", where(o))
			}
			if err := ld.Resign(ctx); !errors.Is(err, quorumlock.ErrNotHeld) {
				t.Errorf("%s: second Resign (Session.Elect): %v, want ErrNotHeld", where(o), err)
			}
			if err := ld.Proclaim(ctx, nil); !errors.Is(err, quorumlock.ErrNotHeld) {
				t.Errorf("%s: Proclaim after Resign: %v, want ErrNotHeld", where(o), err)
			}
			if info, err := o.Leader(ctx, "probe-i/e"); !errors.Is(err, quorumlock.ErrNoLeader) || info.HasLeader() {
				t.Errorf("%s: Leader of a resigned role: %+v %v, want ErrNoLeader", where(o), info, err)
			}

			own, err := o.Elect(ctx, "probe-i/own", []byte("x"))
			if err != nil {
				t.Fatal(err)
			}
			if err := own.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			if err := own.Resign(ctx); err != nil {
				t.Errorf("%s: second Resign (dedicated session): %v, want nil", where(o), err)
			}
			if err := own.Proclaim(ctx, nil); !errors.Is(err, quorumlock.ErrNotHeld) {
				t.Errorf("%s: Proclaim after Resign (dedicated session): %v, want ErrNotHeld", where(o), err)
			}
		}
	})

	// Client operator calls: Locks and Sessions take a limit of 0 or less
	// as 100 and anything above 10,000 as 10,000; RevokeSession of an
	// unknown session is ErrSessionExpired.
	t.Run("ClientAdmin", func(t *testing.T) {
		s := specSession(ctx, t, lead)
		for i := range 101 {
			if _, err := s.Acquire(ctx, "probe-i/page/"+string(rune('a'+i/26))+string(rune('a'+i%26))); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range []struct{ limit, want int }{{0, 100}, {-1, 100}, {10_001, 101}, {1 << 32, 101}, {1<<32 + 5, 101}} {
			page, _, err := cl.Locks(ctx, "probe-i/page/", c.limit)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, e := range page {
				if strings.HasPrefix(e.Name, "probe-i/page/") {
					n++
				}
			}
			if n != c.want {
				t.Errorf("Locks(limit %d): %d entries, want %d", c.limit, len(page), c.want)
			}
		}
		if err := cl.RevokeSession(ctx, 1<<60); !errors.Is(err, quorumlock.ErrSessionExpired) {
			t.Errorf("RevokeSession of an unknown session: %v, want ErrSessionExpired", err)
		}
	})
}

// Start with a ctx that has ended returns ctx's error (documented); Start
// validates before that, so a bad field is ErrInvalidConfig naming it:
// SessionTTL 2 s with the default 1 s election timeout names ElectionTicks,
// a tick of TTL/6 names TickInterval, a negative limit names the limit,
// port 0 outside this replica's own address with Listener names Peers.
func TestReviewIStartErrors(t *testing.T) {
	base := func() quorumlock.Config {
		return quorumlock.Config{ID: 1, Peers: map[uint64]string{1: "127.0.0.1:0"}, DataDir: t.TempDir(), Listener: silentListener(t)}
	}
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := quorumlock.Start(cctx, base()); !errors.Is(err, context.Canceled) {
		if n != nil {
			n.Close()
		}
		t.Errorf("Start with an ended ctx: %v, want context.Canceled", err)
	}
	for _, c := range []struct {
		field  string
		mutate func(*quorumlock.Config)
	}{
		{"ElectionTicks", func(c *quorumlock.Config) { c.SessionTTL = 2 * time.Second }},
		{"TickInterval", func(c *quorumlock.Config) { c.SessionTTL = 6 * time.Second; c.TickInterval = time.Second }},
		{"TickInterval", func(c *quorumlock.Config) { c.TickInterval = -time.Millisecond }},
		{"ElectionTicks", func(c *quorumlock.Config) { c.ElectionTicks = 2 }},
		{"MaxSessions", func(c *quorumlock.Config) { c.MaxSessions = -1 }},
		{"MaxNameBytes", func(c *quorumlock.Config) { c.MaxNameBytes = quorumlock.MaxNameBytesLimit + 1 }},
		{"LogBackend", func(c *quorumlock.Config) { c.LogBackend = "sqlite" }},
		{"PeerTLS", func(c *quorumlock.Config) { c.TLS = &tls.Config{} }},
		{"Peers", func(c *quorumlock.Config) { c.Listener.Close(); c.Listener = nil }},
		{"Peers", func(c *quorumlock.Config) { c.Peers = map[uint64]string{1: "127.0.0.1:0", 2: "127.0.0.1:0"} }},
		{"Peers", func(c *quorumlock.Config) { c.Peers = map[uint64]string{1: "127.0.0.1:0", 2: "127.0.0.1"} }},
	} {
		cfg := base()
		c.mutate(&cfg)
		n, err := quorumlock.Start(context.Background(), cfg)
		if !errors.Is(err, quorumlock.ErrInvalidConfig) || !strings.Contains(err.Error(), c.field) {
			if n != nil {
				n.Close()
			}
			t.Errorf("%s: Start: %v, want ErrInvalidConfig naming %s", c.field, err, c.field)
		}
	}
}

// After Node.Close: Holder, Leader and NewSession return ErrClosed, Observe
// closes at once, the sessions opened through it are over (ErrClosed),
// and Close and HardClose return nil; Release and Session.Close on them
// return ErrClosed (the end cause). After Client.Close the same for the
// client, Status reports ErrClosed per address, and the operator calls
// return ErrClosed.
func TestReviewIClosed(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	specLeader(t, nodes)
	cl := specDial(t, nodes)
	ctx := testCtx(t, 30*time.Second)
	n := nodes[0]
	for _, o := range []opener{n, cl} {
		s := specSession(ctx, t, o)
		l := mustAcquire(t, s, "probe-i/closed-"+where(o))
		if n, ok := o.(*quorumlock.Node); ok {
			if err := n.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := n.Close(); err != nil {
				t.Errorf("second Close: %v, want nil", err)
			}
			if err := n.HardClose(); err != nil {
				t.Errorf("HardClose after Close: %v, want nil", err)
			}
			if !closed(n.Done()) {
				t.Error("Node.Done open after Close")
			}
		} else if err := cl.Close(); err != nil {
			t.Fatalf("Client.Close: %v", err)
		}
		if !closed(s.Done()) || !closed(l.Lost()) || !errors.Is(s.Err(), quorumlock.ErrClosed) {
			t.Errorf("%s: session after close: Done %v Lost %v Err %v, want closed and ErrClosed", where(o), closed(s.Done()), closed(l.Lost()), s.Err())
		}
		if _, err := o.NewSession(ctx); !errors.Is(err, quorumlock.ErrClosed) {
			t.Errorf("%s: NewSession after close: %v, want ErrClosed", where(o), err)
		}
		if _, err := o.Holder(ctx, "x"); !errors.Is(err, quorumlock.ErrClosed) {
			t.Errorf("%s: Holder after close: %v, want ErrClosed", where(o), err)
		}
		if _, err := o.Leader(ctx, "x"); !errors.Is(err, quorumlock.ErrClosed) {
			t.Errorf("%s: Leader after close: %v, want ErrClosed", where(o), err)
		}
		if _, err := o.Elect(ctx, "x", nil); !errors.Is(err, quorumlock.ErrClosed) {
			t.Errorf("%s: Elect after close: %v, want ErrClosed", where(o), err)
		}
		if _, open := <-o.Observe(ctx, "x"); open {
			t.Errorf("%s: Observe after close delivered an event", where(o))
		}
		if _, err := s.Acquire(ctx, "y"); !errors.Is(err, quorumlock.ErrClosed) {
			t.Errorf("%s: Acquire on a session of a closed %s: %v, want ErrClosed", where(o), where(o), err)
		}
		if err := l.Release(ctx); !errors.Is(err, quorumlock.ErrClosed) {
			t.Errorf("%s: Release after close: %v, want ErrClosed", where(o), err)
		}
		if err := s.Close(ctx); !errors.Is(err, quorumlock.ErrClosed) {
			t.Errorf("%s: Session.Close after close: %v, want the end cause ErrClosed", where(o), err)
		}
	}
	for _, st := range cl.Status(ctx) {
		if !errors.Is(st.Err, quorumlock.ErrClosed) {
			t.Errorf("Status after Client.Close: %+v, want ErrClosed", st)
		}
	}
	if _, _, err := cl.Locks(ctx, "", 1); !errors.Is(err, quorumlock.ErrClosed) {
		t.Errorf("Locks after Client.Close: %v", err)
	}
	if _, _, err := cl.Sessions(ctx, 0, 1); !errors.Is(err, quorumlock.ErrClosed) {
		t.Errorf("Sessions after Client.Close: %v", err)
	}
	if err := cl.RevokeSession(ctx, 1); !errors.Is(err, quorumlock.ErrClosed) {
		t.Errorf("RevokeSession after Client.Close: %v", err)
	}
}

// Dial's documented ErrInvalidConfig cases, each before any connection;
// a nil ClientOption is ignored.
func TestReviewIDialErrors(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	addr := []string{"127.0.0.1:1"}
	for name, c := range map[string]struct {
		addrs []string
		opts  []quorumlock.ClientOption
	}{
		"no addrs":    {nil, nil},
		"no port":     {[]string{"localhost"}, nil},
		"dns no port": {[]string{"dns:///localhost"}, nil},
		"ttl low":     {addr, []quorumlock.ClientOption{nil, quorumlock.WithSessionTTL(time.Millisecond)}},
		"ttl high":    {addr, []quorumlock.ClientOption{quorumlock.WithSessionTTL(time.Hour)}},
		"election 0":  {addr, []quorumlock.ClientOption{quorumlock.WithElectionTimeout(0)}},
		"election <0": {addr, []quorumlock.ClientOption{quorumlock.WithElectionTimeout(-time.Second)}},
		"nil clock":   {addr, []quorumlock.ClientOption{quorumlock.WithClock(nil)}},
	} {
		if cl, err := quorumlock.Dial(ctx, c.addrs, c.opts...); !errors.Is(err, quorumlock.ErrInvalidConfig) {
			if cl != nil {
				cl.Close()
			}
			t.Errorf("%s: Dial: %v, want ErrInvalidConfig", name, err)
		}
	}
}

// The zero Fence is ready to use; Admit of an equal token is accepted, a
// lower one is ErrStaleToken and changes nothing; Highest is 0 for an
// unknown resource.
func TestReviewIFence(t *testing.T) {
	var f quorumlock.Fence
	if h := f.Highest("r"); h != 0 {
		t.Errorf("Highest on a zero Fence: %d", h)
	}
	if err := f.Admit("r", 5); err != nil {
		t.Fatal(err)
	}
	if err := f.Admit("r", 5); err != nil {
		t.Errorf("Admit of an equal token: %v", err)
	}
	if err := f.Admit("r", 4); !errors.Is(err, quorumlock.ErrStaleToken) || f.Highest("r") != 5 {
		t.Errorf("Admit of a lower token: %v, highest %d", err, f.Highest("r"))
	}
	if err := f.Admit("other", 1); err != nil {
		t.Errorf("Admit on another resource: %v", err)
	}
}

// The table limits return ErrLimit as Config documents them, through a
// replica and a client: MaxSessions live sessions, MaxLocksPerSession
// locks held or waited for by one session, MaxWaitersPerLock in one
// queue. A Client refuses locally only names past MaxNameBytesLimit.
func TestReviewILimits(t *testing.T) {
	nodes := specCluster(t, 3, func(c *quorumlock.Config) {
		c.MaxSessions = 4
		c.MaxLocksPerSession = 2
		c.MaxWaitersPerLock = 1
	})
	lead := nodes[specLeader(t, nodes)]
	cl := specDial(t, nodes)
	ctx := testCtx(t, 30*time.Second)

	a := specSession(ctx, t, lead)
	b := specSession(ctx, t, cl)
	mustAcquire(t, a, "l1")
	mustAcquire(t, a, "l2")
	if _, err := a.Acquire(ctx, "l3"); !errors.Is(err, quorumlock.ErrLimit) {
		t.Errorf("a third lock with MaxLocksPerSession 2: %v, want ErrLimit", err)
	}
	if _, err := a.Elect(ctx, "r", nil); !errors.Is(err, quorumlock.ErrLimit) {
		t.Errorf("a role past MaxLocksPerSession 2: %v, want ErrLimit", err)
	}
	w := acquireQueued(t, ctx, b, lead, "l1") // the one waiter l1 may have
	c := specSession(ctx, t, lead)
	if _, err := c.Acquire(ctx, "l1"); !errors.Is(err, quorumlock.ErrLimit) {
		t.Errorf("a second waiter with MaxWaitersPerLock 1: %v, want ErrLimit", err)
	}
	if _, err := c.TryAcquire(ctx, "l1"); !errors.Is(err, quorumlock.ErrLocked) {
		t.Errorf("TryAcquire of a lock with a full queue: %v, want ErrLocked", err)
	}
	d := specSession(ctx, t, cl)
	_ = d
	if s, err := lead.NewSession(ctx); !errors.Is(err, quorumlock.ErrLimit) {
		if s != nil {
			s.Close(ctx)
		}
		t.Errorf("a fifth session with MaxSessions 4: %v, want ErrLimit", err)
	}
	if s, err := cl.NewSession(ctx); !errors.Is(err, quorumlock.ErrLimit) {
		if s != nil {
			s.Close(ctx)
		}
		t.Errorf("a fifth session through a client with MaxSessions 4: %v, want ErrLimit", err)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-w; r.err != nil {
		t.Errorf("the waiter after the holder closed: %v", r.err)
	}
	long := strings.Repeat("n", quorumlock.MaxNameBytesLimit+1)
	if _, err := d.Acquire(ctx, long); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("client Acquire of a name past MaxNameBytesLimit: %v, want ErrInvalidName", err)
	}
	if _, err := d.Acquire(ctx, long[:quorumlock.MaxNameBytesLimit]); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("client Acquire of a name past the cluster's MaxNameBytes: %v, want ErrInvalidName", err)
	}
}

// A session that an operator revoked ends with ErrSessionExpired whose
// message does not claim it expired: it said "the cluster expired it",
// which lockctl acquire printed after lockctl release had revoked it.
func TestReviewIRevokedSessionSaysSo(t *testing.T) {
	t.Parallel()
	nodes := specCluster(t, 3, nil)
	lead := nodes[specLeader(t, nodes)]
	cl := specDial(t, nodes)
	ctx := testCtx(t, 30*time.Second)
	for _, o := range []opener{lead, cl} {
		s := specSession(ctx, t, o)
		l := mustAcquire(t, s, "probe-i/revoked-"+where(o))
		if err := cl.RevokeSession(ctx, s.ID()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.Lost():
		case <-ctx.Done():
			t.Fatal("the revoked session's lock was not reported lost")
		}
		err := s.Err()
		if !errors.Is(err, quorumlock.ErrSessionExpired) || !strings.Contains(err.Error(), "revoked") {
			t.Errorf("%s: Err of a revoked session: %v, want ErrSessionExpired naming revocation", where(o), err)
		}
	}
}

// Observe, as documented: first the current state, then every change; an
// event without a leader between two leaders, carrying the last epoch the
// stream reported (0 before any); a Proclaim is an event with the same
// epoch and the new value.
func TestReviewIObserveEvents(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	lead := nodes[specLeader(t, nodes)]
	cl := specDial(t, nodes)
	ctx := testCtx(t, 30*time.Second)
	for _, o := range []opener{lead, cl} {
		role := "probe-i/obs-" + where(o)
		octx, cancel := context.WithCancel(ctx)
		events := o.Observe(octx, role)
		next := func() quorumlock.LeaderInfo {
			t.Helper()
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("%s: Observe closed early", where(o))
				}
				return ev
			case <-ctx.Done():
				t.Fatalf("%s: no Observe event", where(o))
			}
			return quorumlock.LeaderInfo{}
		}
		if ev := next(); ev.HasLeader() || ev.Epoch != 0 || ev.Role != role {
			t.Errorf("%s: first event %+v, want no leader, epoch 0", where(o), ev)
		}
		a, err := o.Elect(ctx, role, []byte("a"))
		if err != nil {
			t.Fatal(err)
		}
		if ev := next(); ev.Session != a.Session().ID() || ev.Epoch != a.Epoch() || string(ev.Value) != "a" {
			t.Errorf("%s: event %+v, want a's leadership at epoch %d", where(o), ev, a.Epoch())
		}
		if err := a.Proclaim(ctx, []byte("a2")); err != nil {
			t.Fatal(err)
		}
		if ev := next(); ev.Epoch != a.Epoch() || string(ev.Value) != "a2" {
			t.Errorf("%s: event after Proclaim %+v, want epoch %d value a2", where(o), ev, a.Epoch())
		}
		s := specSession(ctx, t, o)
		bc := make(chan *quorumlock.Leadership, 1)
		go func() {
			b, err := s.Elect(ctx, role, []byte("b"))
			if err != nil {
				t.Error(err)
			}
			bc <- b
		}()
		for queued := false; !queued; {
			page, _, err := cl.Locks(ctx, "", 10_000)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range page {
				queued = queued || e.Role && e.Name == role && slices.Contains(e.Waiters, s.ID())
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := a.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		b := <-bc
		if ev := next(); ev.HasLeader() || ev.Epoch != a.Epoch() {
			t.Errorf("%s: event between leaders %+v, want no leader with epoch %d", where(o), ev, a.Epoch())
		}
		if ev := next(); b == nil || ev.Session != s.ID() || ev.Epoch != b.Epoch() || ev.Epoch <= a.Epoch() {
			t.Errorf("%s: event %+v, want b's leadership above epoch %d", where(o), ev, a.Epoch())
		}
		cancel()
		for range events {
		}
	}
}
