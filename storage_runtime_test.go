package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
	"github.com/quorumlock/quorumlock/storage"
)

// A snapshot file damaged while the leader runs (WAL backend) is found when
// the leader must send the snapshot to a follower that fell behind: the
// store's Snapshot returns storage.ErrCorrupt, on which raft panics. That
// killed the process (every replica in it); the leader must instead stop
// with the error naming the file, and the other two go on, the lagging one
// catching up from the new leader, with tokens still increasing.
func TestSnapshotDamagedWhileRunningStopsLeader(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Configure: func(cfg *quorumlock.Config) {
		cfg.SnapshotEntries = 50
		cfg.LogBackend = quorumlock.LogWAL
	}})
	lead := c.WaitLeader(10 * time.Second)
	lag := c.IDs()[0]
	if lag == lead {
		lag = c.IDs()[1]
	}
	c.Stop(lag)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := c.Node(lead).NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var last quorumlock.Token
	for i := range 300 { // the leader snapshots and compacts past lag's log
		l, err := s.Acquire(ctx, fmt.Sprintf("l%d", i%20))
		if err != nil {
			t.Fatal(err)
		}
		last = l.Token()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	snaps, err := filepath.Glob(filepath.Join(c.Config(lead).DataDir, "wal", "*.snap"))
	if err != nil || len(snaps) != 1 {
		t.Fatalf("the leader's snapshot files: %v, %v", snaps, err)
	}
	b, err := os.ReadFile(snaps[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(snaps[0], b, 0o600); err != nil {
		t.Fatal(err)
	}

	c.Restart(lag)
	select {
	case <-c.Node(lead).Done():
	case <-time.After(time.Minute): // a hang detector, not a timing assertion
		t.Fatalf("the leader did not stop on its damaged snapshot; lagging replica: %+v", c.Node(lag).Status())
	}
	if err := c.Node(lead).Err(); !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), filepath.Base(snaps[0])) {
		t.Fatalf("the leader's Err() = %v, want storage.ErrCorrupt naming %s", err, filepath.Base(snaps[0]))
	}
	if st := c.Node(lead).Status(); st.Leader != 0 {
		t.Fatalf("the stopped leader's Status still names leader %d", st.Leader)
	}

	var other uint64
	for _, id := range c.IDs() {
		if id != lead && id != lag {
			other = id
		}
	}
	s2, err := c.Node(other).NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s2.Acquire(ctx, "l1")
	if err != nil {
		t.Fatal(err)
	}
	if l.Token() <= last {
		t.Fatalf("token after the leader stopped = %d, want above %d", l.Token(), last)
	}
	catchUpWait(t, c, []uint64{lag, other}, time.Minute)
}
