package quorumlock_test

import (
	"errors"
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
