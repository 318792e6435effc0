package quorumlock_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
	"github.com/quorumlock/quorumlock/storage/pebblestore"
)

// With frequent snapshots, a follower that was down while the log moved
// past it catches up from a snapshot sent by the leader; every replica
// restarts from its snapshot plus the log tail; nothing acknowledged is
// lost and the log is compacted.
func TestSnapshotCatchUpAndRestart(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, Configure: func(cfg *quorumlock.Config) {
		cfg.SnapshotEntries = 100
	}})
	lead := c.WaitLeader(5 * time.Second)
	lagger := follower(c, lead)
	c.Stop(lagger)
	other := follower(c, lead, lagger)
	s := newSession(t, c.Node(other), quorumlock.WithTTL(time.Minute))
	var kept []*quorumlock.Lock
	// Several times SnapshotEntries + the catch-up tail (50 entries).
	for i := range 200 {
		l := mustAcquire(t, s, fmt.Sprint("k", i%50))
		if i >= 150 {
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
			t.Fatalf("lagging replica stuck at %d of %d", c.Node(lagger).Status().Applied, c.Node(lead).Status().Commit)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, l := range kept {
		if info := holder(t, c.Node(lagger), l.Name()); info.Holder != s.ID() || info.Token != l.Token() {
			t.Fatalf("caught-up replica: %+v, want token %d", info, l.Token())
		}
	}

	c.StopAll()
	for _, id := range c.IDs() {
		st, err := pebblestore.Open(filepath.Join(c.Config(id).DataDir, "log"), pebblestore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		first, _ := st.FirstIndex()
		snap, _ := st.Snapshot()
		st.Close()
		if first <= 1 || snap.GetMetadata().GetIndex() == 0 {
			t.Fatalf("replica %d: log not compacted (first index %d, snapshot at %d)", id, first, snap.GetMetadata().GetIndex())
		}
	}
	for _, id := range c.IDs() {
		c.Restart(id)
	}
	lead = c.WaitLeader(5 * time.Second)
	for _, l := range kept {
		if info := holder(t, c.Node(lead), l.Name()); info.Holder != s.ID() || info.Token != l.Token() {
			t.Fatalf("after restart: %+v, want token %d", info, l.Token())
		}
	}
	s2 := newSession(t, c.Node(lead))
	if l := mustAcquire(t, s2, "fresh"); l.Token() <= kept[len(kept)-1].Token() {
		t.Fatal("token did not grow after restart from snapshot")
	}
}
