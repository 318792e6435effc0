package quorumlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// The errors the public docstrings promise, call by call, on a replica and
// through a client: TryAcquire's ErrLocked and its own grant, Release
// twice, names and values over their bounds, Leader without one, Resign and
// Proclaim after Resign (Session.Elect and Node/Client.Elect), WithTTL's
// range and millisecond truncation, Close twice, calls after Close, a
// revoked session, Observe, Elect, Leader and Holder of a name empty or
// over MaxNameBytes (which the client leaves to the replicas), Client.Locks'
// cursor,
// calls after Node.Close and Client.Close, Client.Status with an ended ctx,
// and the zero Fence. A docstring and its code that drift apart fail here.
func TestReviewVDocumentedErrors(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	id := c.WaitLeader(5 * time.Second)
	n := c.Node(id)
	cl := dial(t, addrsOf(c, id))
	ctx := testCtx(t, 30*time.Second)
	check := func(what string, err, want error) {
		t.Helper()
		if want == nil && err != nil || want != nil && !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		} else {
			t.Logf("%s: ok (%v)", what, err)
		}
	}
	for _, o := range []opener{n, cl} {
		s := newSession(t, o)
		s2 := newSession(t, o)
		l := mustAcquire(t, s, "a")
		_, err := s2.TryAcquire(ctx, "a")
		check("TryAcquire held", err, quorumlock.ErrLocked)
		l2, err := s.TryAcquire(ctx, "a")
		check("TryAcquire own", err, nil)
		if l2 != nil && l2.Token() != l.Token() {
			t.Errorf("TryAcquire own: token %d, want %d", l2.Token(), l.Token())
		}
		check("Release", l.Release(ctx), nil)
		check("Release again", l.Release(ctx), quorumlock.ErrNotHeld)
		_, err = s.Acquire(ctx, strings.Repeat("x", 257))
		check("Acquire 257 bytes", err, quorumlock.ErrInvalidName)
		_, err = o.Holder(ctx, "")
		check("Holder empty", err, quorumlock.ErrInvalidName)
		_, err = o.Leader(ctx, "nobody")
		check("Leader none", err, quorumlock.ErrNoLeader)
		_, err = s.Elect(ctx, "r", make([]byte, quorumlock.MaxValueBytes+1))
		check("Elect big value", err, quorumlock.ErrLimit)
		ld, err := s.Elect(ctx, "r", []byte("v"))
		check("Elect", err, nil)
		check("Proclaim big", ld.Proclaim(ctx, make([]byte, quorumlock.MaxValueBytes+1)), quorumlock.ErrLimit)
		check("Resign", ld.Resign(ctx), nil)
		check("Resign again", ld.Resign(ctx), quorumlock.ErrNotHeld)
		check("Proclaim after resign", ld.Proclaim(ctx, nil), quorumlock.ErrNotHeld)
		_, err = o.NewSession(ctx, quorumlock.WithTTL(999*time.Millisecond))
		check("NewSession 999ms", err, quorumlock.ErrInvalidTTL)
		s3, err := o.NewSession(ctx, quorumlock.WithTTL(2500*time.Microsecond+2*time.Second))
		check("NewSession 2.0025s", err, nil)
		if s3 != nil && s3.TTL() != 2002*time.Millisecond {
			t.Errorf("TTL %v", s3.TTL())
		}
		check("Close", s.Close(ctx), nil)
		check("Close again", s.Close(ctx), nil)
		_, err = s.Acquire(ctx, "b")
		check("Acquire after close", err, quorumlock.ErrSessionExpired)
		ld2, err := o.Elect(ctx, "r2", nil)
		check("o.Elect", err, nil)
		check("o.Resign", ld2.Resign(ctx), nil)
		check("o.Resign again", ld2.Resign(ctx), nil)
		check("Revoke s2", cl.RevokeSession(ctx, s2.ID()), nil)
		check("Revoke s2 again", cl.RevokeSession(ctx, s2.ID()), quorumlock.ErrSessionExpired)
		select {
		case <-s2.Done():
		case <-time.After(5 * time.Second):
			t.Errorf("revoked session's Done still open")
		}
		check("s2 Close after revoke", s2.Close(ctx), quorumlock.ErrSessionExpired)
		for _, role := range []string{"", strings.Repeat("r", 257)} {
			ch := o.Observe(ctx, role)
			select {
			case _, ok := <-ch:
				if ok {
					t.Errorf("Observe of an invalid role (%d bytes) sent a value", len(role))
				}
			case <-time.After(2 * time.Second):
				t.Errorf("Observe of an invalid role (%d bytes) not closed at once", len(role))
			}
		}
		s4 := newSession(t, o)
		_, err = s4.Elect(ctx, strings.Repeat("r", 257), nil)
		check("Elect 257-byte role", err, quorumlock.ErrInvalidName)
		_, err = o.Leader(ctx, strings.Repeat("r", 257))
		check("Leader 257-byte role", err, quorumlock.ErrInvalidName)
		_, err = o.Holder(ctx, strings.Repeat("r", 257))
		check("Holder 257-byte name", err, quorumlock.ErrInvalidName)
	}
	_, _, err := cl.Locks(ctx, "\xff", 0)
	check("Locks bad cursor", err, quorumlock.ErrInvalidName)
	ended, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	cancel()
	for _, st := range cl.Status(ended) {
		if st.Addr != c.Peers()[id] || status.Code(st.Err) != codes.DeadlineExceeded {
			t.Errorf("Status with an ended ctx: %+v, want Addr %s and a DeadlineExceeded error", st, c.Peers()[id])
		}
	}
	for _, st := range cl.Status(ctx) {
		if st.Err != nil || st.ID != id {
			t.Errorf("Status: %+v", st)
		}
	}
	s := newSession(t, n)
	scl := newSession(t, cl)
	l := mustAcquire(t, s, "z")
	n.Close()
	check("Release after Node.Close", l.Release(ctx), quorumlock.ErrClosed)
	check("Close after Node.Close", s.Close(ctx), quorumlock.ErrClosed)
	_, err = n.NewSession(ctx)
	check("NewSession after Node.Close", err, quorumlock.ErrClosed)
	cl.Close()
	for _, st := range cl.Status(ctx) {
		if !errors.Is(st.Err, quorumlock.ErrClosed) {
			t.Errorf("Status after Client.Close: %+v, want ErrClosed", st)
		}
	}
	_, err = scl.Acquire(ctx, "q")
	check("Acquire after Client.Close", err, quorumlock.ErrClosed)
	_, err = cl.Holder(ctx, "q")
	check("Holder after Client.Close", err, quorumlock.ErrClosed)
	var f quorumlock.Fence
	check("zero Fence", f.Admit("r", 5), nil)
	check("zero Fence equal", f.Admit("r", 5), nil)
	check("zero Fence lower", f.Admit("r", 4), quorumlock.ErrStaleToken)
}
