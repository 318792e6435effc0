package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// The cluster runs the same on etcd's WAL: locks, snapshots with log
// compaction, a lagging follower caught up by snapshot, a full restart.
func TestWALBackend(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, Configure: func(cfg *quorumlock.Config) {
		cfg.LogBackend = quorumlock.LogWAL
		cfg.SnapshotEntries = 100
	}})
	lead := c.WaitLeader(5 * time.Second)
	lagger := follower(c, lead)
	c.Stop(lagger)
	s := newSession(t, c.Node(lead), quorumlock.WithTTL(time.Minute))
	var kept []*quorumlock.Lock
	for i := range 200 {
		l := mustAcquire(t, s, fmt.Sprint("w", i%40))
		if i >= 160 {
			kept = append(kept, l)
			continue
		}
		if err := l.Release(testCtx(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	c.Restart(lagger)
	deadline := time.Now().Add(20 * time.Second)
	for c.Node(lagger).Status().Applied < c.Node(lead).Status().Commit {
		if time.Now().After(deadline) {
			t.Fatal("lagging WAL replica did not catch up")
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.StopAll()
	for _, id := range c.IDs() {
		c.Restart(id)
	}
	lead = c.WaitLeader(5 * time.Second)
	for _, l := range kept {
		if info := holder(t, c.Node(lead), l.Name()); info.Holder != s.ID() || info.Token != l.Token() {
			t.Fatalf("after restart on the WAL: %+v, want token %d", info, l.Token())
		}
	}
}

// A data directory keeps the backend it was made with.
func TestBackendMismatchRefused(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	c.WaitLeader(5 * time.Second)
	c.Stop(1)
	cfg := c.Config(1)
	cfg.LogBackend = quorumlock.LogWAL
	if n, err := quorumlock.Start(context.Background(), cfg); !errors.Is(err, quorumlock.ErrInvalidConfig) {
		if n != nil {
			n.Close()
		}
		t.Fatalf("Start with the other backend: %v", err)
	}
}
