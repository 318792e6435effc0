package quorumlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
)

// The limits of Config (DESIGN.md "Bad input": ErrLimit) hold for sessions
// opened on a replica and through a client, and a refused request changes
// nothing.
func TestSpecLimits(t *testing.T) {
	nodes := specCluster(t, 3, func(c *quorumlock.Config) {
		c.MaxSessions = 4
		c.MaxLocksPerSession = 2
		c.MaxWaitersPerLock = 1
	})
	ops := specOpeners(t, nodes)
	ctx := testCtx(t, 20*time.Second)
	a, err := ops[0].o.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ops[1].o.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ops[1].o.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Locks per session.
	l1, err := a.TryAcquire(ctx, "l1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.TryAcquire(ctx, "l2"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.TryAcquire(ctx, "l3"); !errors.Is(err, quorumlock.ErrLimit) {
		t.Fatalf("third lock of a session limited to 2: %v, want ErrLimit", err)
	}
	if _, err := a.Acquire(ctx, "l3"); !errors.Is(err, quorumlock.ErrLimit) {
		t.Fatalf("Acquire of a third lock: %v, want ErrLimit", err)
	}
	if info, err := ops[0].o.Holder(ctx, "l3"); err != nil || info.Holder != 0 {
		t.Fatalf("refused lock: %+v, %v", info, err)
	}
	// Waiters per lock.
	waiting := make(chan error, 1)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	go func() {
		_, err := b.Acquire(wctx, "l1")
		waiting <- err
	}()
	for {
		info, err := ops[1].o.Holder(ctx, "l1")
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Waiters) == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.Acquire(ctx, "l1"); !errors.Is(err, quorumlock.ErrLimit) {
		t.Fatalf("second waiter of a lock limited to 1: %v, want ErrLimit", err)
	}
	if info, err := ops[1].o.Holder(ctx, "l1"); err != nil || len(info.Waiters) != 1 || info.Waiters[0] != b.ID() || info.Holder != a.ID() || info.Token != l1.Token() {
		t.Fatalf("after a refused waiter: %+v, %v", info, err)
	}
	// Sessions: 3 open, one more fits, then ErrLimit.
	d, err := ops[0].o.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ops[0].o.NewSession(ctx); !errors.Is(err, quorumlock.ErrLimit) {
		t.Fatalf("fifth session of 4: %v, want ErrLimit", err)
	}
	if _, err := ops[1].o.NewSession(ctx); !errors.Is(err, quorumlock.ErrLimit) {
		t.Fatalf("fifth session of 4 through a client: %v, want ErrLimit", err)
	}
	if err := d.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ops[1].o.NewSession(ctx); err != nil {
		t.Fatalf("a session after one closed: %v", err)
	}
	for _, s := range []*quorumlock.Session{a, b, c} {
		if closed(s.Done()) {
			t.Fatalf("session %d ended", s.ID())
		}
	}
	wcancel()
	<-waiting
}
