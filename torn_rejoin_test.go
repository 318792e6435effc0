package quorumlock_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// A follower whose final log record is torn (the file ends inside it, as
// after a power loss during the write) is repaired when
// it starts and rejoins the cluster: it catches up with what was decided
// while it was down and serves a linearizable read of every lock. The
// stores' own tests (storage/walstore TestTornFinalRecord, pebblestore
// TestTornWALTail) show the repair; this shows the replica rejoins.
func TestTornFinalRecordFollowerRejoins(t *testing.T) {
	for _, c := range []struct {
		backend quorumlock.LogBackend
		glob    string // the log files under DataDir, newest last by name
	}{
		{quorumlock.LogPebble, "log/*.log"},
		{quorumlock.LogWAL, "wal/wal-*/*.wal"},
	} {
		t.Run(string(c.backend), func(t *testing.T) {
			cl := testcluster.New(t, testcluster.Options{Size: 3, Configure: func(cfg *quorumlock.Config) {
				cfg.LogBackend = c.backend
			}})
			lead := cl.WaitLeader(5 * time.Second)
			f := follower(cl, lead)
			s := newSession(t, cl.Node(lead), quorumlock.WithTTL(time.Minute))
			want := map[string]quorumlock.Token{}
			for i := range 10 {
				name := fmt.Sprint("t", i)
				want[name] = mustAcquire(t, s, name).Token()
			}
			// The follower has the entries (it acknowledged them or will
			// have them on the next heartbeat); wait until it applied them
			// so that its final record is one of them.
			deadline := time.Now().Add(10 * time.Second)
			for cl.Node(f).Status().Applied < cl.Node(lead).Status().Commit {
				if time.Now().After(deadline) {
					t.Fatal("the follower did not catch up before the tear")
				}
				time.Sleep(10 * time.Millisecond)
			}
			dir := cl.Config(f).DataDir
			cl.Stop(f)

			logs, _ := filepath.Glob(filepath.Join(dir, c.glob))
			if len(logs) == 0 {
				t.Fatalf("no %s under %s", c.glob, dir)
			}
			slices.Sort(logs)
			last := logs[len(logs)-1]
			b, err := os.ReadFile(last)
			if err != nil {
				t.Fatal(err)
			}
			n := used(b)
			if n < 64 {
				t.Fatalf("%s: only %d bytes written", last, n)
			}
			// The file ends inside its final record: the write was torn.
			if err := os.WriteFile(last, b[:n-4], 0o640); err != nil {
				t.Fatal(err)
			}

			// Decided while the follower is down.
			for i := 10; i < 15; i++ {
				name := fmt.Sprint("t", i)
				want[name] = mustAcquire(t, s, name).Token()
			}
			cl.Restart(f)
			node := cl.Node(f)
			if node == nil {
				t.Fatalf("replica %d did not start after its final record was torn", f)
			}
			if c.backend == quorumlock.LogWAL {
				// wal.Repair keeps a copy of the segment it cut.
				if kept, _ := filepath.Glob(filepath.Join(dir, "wal/wal-*/*.broken")); len(kept) == 0 {
					t.Errorf("no .broken copy under %s: the torn record was not repaired", dir)
				}
			}
			for name, tok := range want {
				info, err := node.Holder(testCtx(t, 10*time.Second), name)
				if err != nil {
					t.Fatalf("Holder(%s) through the repaired replica: %v", name, err)
				}
				if info.Holder != s.ID() || info.Token != tok {
					t.Fatalf("Holder(%s) through the repaired replica: %+v, want session %d token %d", name, info, s.ID(), tok)
				}
			}
			deadline = time.Now().Add(10 * time.Second)
			for node.Status().Applied < cl.Node(lead).Status().Commit {
				if time.Now().After(deadline) {
					t.Fatalf("the repaired replica applied %d, the leader committed %d", node.Status().Applied, cl.Node(lead).Status().Commit)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
