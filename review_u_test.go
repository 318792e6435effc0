package quorumlock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// A rolling change that lowers MaxNameBytes (Config: "a changed limit
// takes effect once a replica configured with it leads") leaves the locks
// and roles granted under the old limit releasable: their holder's
// Release, Resign and Proclaim, and the withdrawal of a waiter that stops
// waiting, succeed under a leader with the lower limit, instead of being
// refused as invalid names, which left each lock with a live session that
// could no longer give it up (Release said "CODE_INVALID" and closed
// Lost, Proclaim said ErrLimit, an interrupted Acquire abandoned its
// session). New acquires of such names are still refused, at once.
func TestReviewULoweredNameLimitKeepsHeldLocksReleasable(t *testing.T) {
	_, cl, lower := nameLimitCluster(t)
	ctx := testCtx(t, 60*time.Second)
	s := specSession(ctx, t, cl)
	other := specSession(ctx, t, cl)
	long := strings.Repeat("n", 200)
	l, err := s.Acquire(ctx, long)
	if err != nil {
		t.Fatal(err)
	}
	ld, err := s.Elect(ctx, long, []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}
	blocker, err := other.Acquire(ctx, long+"-q")
	if err != nil {
		t.Fatal(err)
	}
	// s waits for long+"-q" across the change: its Acquire is sent again
	// to each new leader.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := acquireAsync(wctx, s, long+"-q")
	waitListed(t, cl, long+"-q", s.ID())

	lower(100)

	if _, err := s.Acquire(ctx, long+"-new"); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("Acquire of a new %d-byte name under MaxNameBytes 100: %v, want ErrInvalidName", len(long)+4, err)
	}
	// A new Acquire of a name over the limit that another session holds is
	// refused at once, not once the holder lets go.
	nctx, ncancel := context.WithTimeout(ctx, 3*time.Second)
	third := specSession(ctx, t, cl)
	if _, err := third.Acquire(nctx, long+"-q"); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("Acquire by another session of a held %d-byte name under MaxNameBytes 100: %v, want ErrInvalidName", len(long)+2, err)
	}
	ncancel()
	// The waiter still waits; when it stops waiting it withdraws, and its
	// session lives on.
	select {
	case r := <-ch:
		t.Errorf("the waiting Acquire returned %v %v while the lock is held", r.l, r.err)
	case <-time.After(100 * time.Millisecond):
		waitListed(t, cl, long+"-q", s.ID())
		cancel()
		if r := <-ch; !errors.Is(r.err, context.Canceled) || s.Err() != nil {
			t.Errorf("interrupted Acquire: %v %v; session: %v (want ctx's error, session alive)", r.l, r.err, s.Err())
		}
	}
	if err := ld.Proclaim(ctx, []byte("v2")); err != nil {
		t.Errorf("Proclaim: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
	if err := ld.Resign(ctx); err != nil {
		t.Errorf("Resign: %v", err)
	}
	if err := blocker.Release(ctx); err != nil {
		t.Errorf("Release of the blocker: %v", err)
	}
	ents, _, err := cl.Locks(ctx, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("still listed: role %v, %d bytes, holder %d, waiters %v", e.Role, len(e.Name), e.Holder, e.Waiters)
	}
	if err := s.Err(); err != nil {
		t.Errorf("session ended: %v", err)
	}
}

// nameLimitCluster starts a 3-replica cluster with MaxNameBytes 256 and
// a Client of it, and returns with them lower(n), which restarts every
// replica, one after another, with MaxNameBytes n.
func nameLimitCluster(t *testing.T) (*testcluster.Cluster, *quorumlock.Client, func(n int)) {
	var maxName atomic.Int64
	maxName.Store(256)
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 10 * time.Second,
		Configure: func(cfg *quorumlock.Config) { cfg.MaxNameBytes = int(maxName.Load()) }})
	c.WaitLeader(10 * time.Second)
	var addrs []string
	for _, a := range c.Peers() {
		addrs = append(addrs, a)
	}
	cl, err := quorumlock.Dial(testCtx(t, 10*time.Second), addrs, quorumlock.WithElectionTimeout(c.ElectionTimeout()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return c, cl, func(n int) {
		maxName.Store(int64(n))
		for _, id := range c.IDs() {
			c.Close(id)
			c.Restart(id)
			c.WaitLeader(10 * time.Second)
		}
	}
}

// waitListed waits until session waits for name, as Client.Locks lists
// it.
func waitListed(t *testing.T, cl *quorumlock.Client, name string, session uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ents, _, err := cl.Locks(testCtx(t, 10*time.Second), "", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.Name == name && slices.Contains(e.Waiters, session) {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("session %d never queued for a %d-byte name", session, len(name))
}
