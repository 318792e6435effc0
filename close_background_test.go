package quorumlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// A Session.Close that no leader answers within its ctx returns
// ErrUnknownOutcome and goes on closing in the background: once a leader
// is back, the session's lock is freed at once, not a TTL later. (Before,
// the session only stopped heartbeating, and the cluster held its lock
// until the TTL ran out under the new leader: 20 s here.)
func TestCloseWithoutLeaderGoesOnInBackground(t *testing.T) {
	const ttl = 20 * time.Second
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: ttl})
	ld := c.WaitLeader(10 * time.Second)
	f := follower(c, ld)
	third := follower(c, ld, f)
	s := newSession(t, c.Node(f))
	l := mustAcquire(t, s, "x")

	c.Stop(ld)
	c.Stop(third)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err := s.Close(ctx)
	cancel()
	if !errors.Is(err, quorumlock.ErrUnknownOutcome) {
		t.Fatalf("Close without a leader: %v, want ErrUnknownOutcome", err)
	}
	if !closed(s.Done()) || !closed(l.Lost()) {
		t.Fatal("Close returned with the session still live")
	}
	c.Restart(ld)
	c.Restart(third)
	nl := c.WaitLeader(20 * time.Second)
	// Well under the TTL that an expiry would take (a new leader gives
	// every session a fresh TTL).
	deadline := time.Now().Add(ttl / 2)
	for {
		info, err := c.Node(nl).Holder(testCtx(t, 5*time.Second), "x")
		if err == nil && info.Holder == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("x is still held %v after the leader came back: %+v, %v", ttl/2, info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
