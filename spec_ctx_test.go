package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
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
