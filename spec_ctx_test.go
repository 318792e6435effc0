package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
)

// Calls made with a context that has already ended return its error
// (invariant 12) and leave nothing behind: no grant, no waiter.
func TestSpecEndedContext(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	for _, tc := range specOpeners(t, nodes) {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 20*time.Second)
			s := specSession(ctx, t, tc.o)
			l, err := s.TryAcquire(ctx, "held")
			if err != nil {
				t.Fatal(err)
			}
			ended, cancel := context.WithCancel(ctx)
			cancel()
			check := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, context.Canceled) {
					t.Errorf("%s with an ended ctx: %v, want context.Canceled", what, err)
				}
			}
			_, err = tc.o.NewSession(ended)
			check("NewSession", err)
			_, err = s.Acquire(ended, "free")
			check("Acquire", err)
			// Each call is a chance for a request sent anyway to win
			// the race with the ctx check.
			for i := range 10 {
				_, err = s.TryAcquire(ended, fmt.Sprint("free2-", i))
				check("TryAcquire", err)
			}
			_, err = tc.o.Holder(ended, "held")
			check("Holder", err)
			_, err = tc.o.Leader(ended, "role")
			check("Leader", err)
			_, err = s.Elect(ended, "role", nil)
			check("Session.Elect", err)
			_, err = tc.o.Elect(ended, "role2", nil)
			check("Elect", err)
			check("Release", l.Release(ended))
			for _, name := range []string{"free", "free2-0", "free2-9"} {
				if info, err := tc.o.Holder(ctx, name); err != nil || info.Holder != 0 || len(info.Waiters) != 0 {
					t.Errorf("%s after an ended-ctx call: %+v, %v", name, info, err)
				}
			}
			for _, role := range []string{"role", "role2"} {
				if info, err := tc.o.Leader(ctx, role); err == nil {
					t.Errorf("%s has a leader after an ended-ctx Elect: %+v", role, info)
				}
			}
			if n := len(s.Locks()); n != 1 {
				t.Errorf("the session holds %d locks, want 1", n)
			}
			if closed(s.Done()) {
				t.Fatal("ended-ctx calls ended the session")
			}
			if info, err := tc.o.Holder(ctx, "held"); err != nil || info.Holder != s.ID() {
				t.Errorf("held after a Release with an ended ctx: %+v, %v", info, err)
			}
		})
	}
}

// An Acquire with a deadline waits for the lock nearly until that
// deadline, as callers of etcd's Mutex.Lock or Curator's acquire(time)
// expect: a lock released 60% of the way through a 2 s wait is granted.
// (Acquire once stopped waiting half the remaining time early, to keep
// that time for settling its outcome, and returned DeadlineExceeded at
// 1 s here.)
// The cluster and the client have the default 1 s election timeout.
func TestSpecAcquireWaitsNearlyItsWholeDeadline(t *testing.T) {
	nodes := specCluster(t, 3, func(c *quorumlock.Config) { c.TickInterval = 100 * time.Millisecond })
	lead := specLeader(t, nodes)
	client, err := quorumlock.Dial(testCtx(t, 10*time.Second), specAddrs(nodes))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	for _, tc := range []struct {
		name string
		o    opener
	}{{"follower", nodes[(lead+1)%len(nodes)]}, {"client", client}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 20*time.Second)
			holder := specSession(ctx, t, tc.o)
			waiter := specSession(ctx, t, tc.o)
			l, err := holder.Acquire(ctx, "lock")
			if err != nil {
				t.Fatal(err)
			}
			const wait, releaseAt = 2 * time.Second, 1200 * time.Millisecond
			released := make(chan error, 1)
			time.AfterFunc(releaseAt, func() { released <- l.Release(ctx) })
			wctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			got, err := waiter.Acquire(wctx, "lock")
			if err != nil {
				t.Fatalf("Acquire with a %v deadline, the lock released after %v: %v", wait, releaseAt, err)
			}
			if err := <-released; err != nil {
				t.Fatal(err)
			}
			if got.Token() <= l.Token() {
				t.Fatalf("token %d after %d", got.Token(), l.Token())
			}
		})
	}
}
