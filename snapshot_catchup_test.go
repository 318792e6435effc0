package quorumlock_test

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/testcluster"
	"github.com/quorumlock/quorumlock/storage"
	"github.com/quorumlock/quorumlock/storage/pebblestore"
	"github.com/quorumlock/quorumlock/storage/walstore"
)

// catchUpNames are the lock names the snapshot/restart scenario uses.
var catchUpNames = func() []string {
	var out []string
	for i := range 5 {
		out = append(out, fmt.Sprint("q", i))
	}
	for i := range 10 {
		out = append(out, fmt.Sprint("k", i))
	}
	return append(out, "v1a", "v1b", "v2", "fresh")
}()

// catchUpTable renders the replica's table of every catchUpNames name through
// linearizable reads on that replica.
func catchUpTable(t *testing.T, n *quorumlock.Node) string {
	t.Helper()
	var b strings.Builder
	for _, name := range catchUpNames {
		info := holder(t, n, name)
		fmt.Fprintf(&b, "%s holder=%d token=%d waiters=%v\n", name, info.Holder, info.Token, info.Waiters)
	}
	return b.String()
}

// catchUpOffline rebuilds a stopped replica's lock table from its data
// directory the way a restart does (latest snapshot, then the log up to its
// last index) and renders all of it: sessions with TTLs, locks with
// holders, tokens, waiters in order and values.
func catchUpOffline(t *testing.T, backend quorumlock.LogBackend, dataDir string) (string, uint64) {
	t.Helper()
	var (
		st  storage.LogStore
		err error
	)
	if backend == quorumlock.LogWAL {
		st, err = walstore.Open(filepath.Join(dataDir, "wal"), walstore.Options{})
	} else {
		st, err = pebblestore.Open(filepath.Join(dataDir, "log"), pebblestore.Options{})
	}
	if err != nil {
		t.Fatalf("open %s: %v", dataDir, err)
	}
	defer st.Close()
	snap, err := st.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	m := fsm.New(fsm.Limits{})
	if len(snap.GetData()) > 0 {
		if m, err = fsm.Restore(snap.GetData(), fsm.Limits{}); err != nil {
			t.Fatalf("restore %s: %v", dataDir, err)
		}
	}
	last, _ := st.LastIndex()
	from := snap.GetMetadata().GetIndex() + 1
	if from <= last {
		ents, err := st.Entries(from, last+1, math.MaxUint64)
		if err != nil {
			t.Fatalf("entries %d..%d of %s: %v", from, last, dataDir, err)
		}
		for _, e := range ents {
			if e.GetType() != raftpb.EntryNormal || len(e.GetData()) == 0 {
				m.SetApplied(e.GetIndex())
				continue
			}
			m.ApplyEntry(e.GetIndex(), e.GetTerm(), e.GetData())
		}
	}
	var b strings.Builder
	for _, s := range m.Sessions() {
		fmt.Fprintf(&b, "session %d ttl=%d\n", s.ID, s.TTL)
	}
	locks, _ := m.Locks("", 1<<20)
	for _, l := range locks {
		fmt.Fprintf(&b, "lock %q holder=%d token=%d waiters=%v value=%q\n", l.Name, l.Holder, l.Token, l.Waiters, l.Value)
	}
	return b.String(), m.Applied()
}

func catchUpWait(t *testing.T, c *testcluster.Cluster, ids []uint64, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		lead := c.Leader()
		ok := lead != 0
		if ok {
			commit := c.Node(lead).Status().Commit
			for _, id := range ids {
				if c.Node(id).Status().Applied < commit {
					ok = false
				}
			}
		}
		if ok {
			return
		}
		for _, id := range ids {
			if err := c.Node(id).Err(); err != nil {
				t.Fatalf("replica %d stopped: %v", id, err)
			}
		}
		if time.Now().After(deadline) {
			for _, id := range ids {
				t.Logf("replica %d: %+v", id, c.Node(id).Status())
			}
			t.Fatalf("replicas did not catch up within %v", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Invariants 2, 3, 8 and 10 with snapshots every 20 entries, on both log
// backends: a follower misses waits, grants, elections and an expiry storm
// (sessions expiring while they hold locks with waiters and while they
// wait), catches up by a snapshot from the leader, and every replica's
// table agrees (online, through linearizable reads; offline, the full table
// rebuilt from each data directory as a restart does it). Then every
// replica restarts and tokens and epochs keep growing.
func TestSnapshotCatchUpExpiryRestartTablesAgree(t *testing.T) {
	for _, backend := range []quorumlock.LogBackend{quorumlock.LogPebble, quorumlock.LogWAL} {
		t.Run(string(backend), func(t *testing.T) {
			c := testcluster.New(t, testcluster.Options{Size: 5, Configure: func(cfg *quorumlock.Config) {
				cfg.SnapshotEntries = 20
				cfg.LogBackend = backend
			}})
			lead := c.WaitLeader(10 * time.Second)
			lagger := follower(c, lead)
			c.Stop(lagger)
			victim := follower(c, lead, lagger)
			home := follower(c, lead, lagger, victim)

			sA := newSession(t, c.Node(home), quorumlock.WithTTL(time.Minute))
			ld, err := sA.Elect(testCtx(t, 10*time.Second), "sched", []byte("A"))
			if err != nil {
				t.Fatal(err)
			}
			epoch1 := ld.Epoch()
			held := map[string]*quorumlock.Lock{}
			for i := range 5 {
				held[fmt.Sprint("q", i)] = mustAcquire(t, sA, fmt.Sprint("q", i))
			}
			sV1 := newSession(t, c.Node(victim), quorumlock.WithTTL(time.Second))
			sV2 := newSession(t, c.Node(victim), quorumlock.WithTTL(time.Second))
			sV3 := newSession(t, c.Node(victim), quorumlock.WithTTL(2*time.Second))
			mustAcquire(t, sV1, "v1a")
			mustAcquire(t, sV1, "v1b")
			mustAcquire(t, sV2, "v2")

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			wait := func(s *quorumlock.Session, name string) {
				wg.Add(1)
				go func() { defer wg.Done(); s.Acquire(ctx, name) }()
				waitQueued(t, c.Node(home), name, s.ID())
			}
			wait(sV1, "q0")
			wait(sV2, "q0")
			wait(sV1, "q1")
			wait(sV2, "q2")
			wait(sV3, "v2")
			var gotV1a *quorumlock.Lock
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := sA.Acquire(ctx, "v1a")
				if err == nil {
					gotV1a = l
				}
			}()
			waitQueued(t, c.Node(home), "v1a", sA.ID())

			churn := func(n int) {
				for i := range n {
					l := mustAcquire(t, sA, fmt.Sprint("k", i%10))
					if err := l.Release(testCtx(t, 10*time.Second)); err != nil {
						t.Fatal(err)
					}
				}
			}
			churn(60)

			// The victim's replica stops: its sessions stop heartbeating and
			// expire at the leader, while they hold locks with waiters and
			// while they wait.
			c.Stop(victim)
			deadline := time.Now().Add(20 * time.Second)
			for {
				v2 := holder(t, c.Node(home), "v2")
				v1a := holder(t, c.Node(home), "v1a")
				if v2.Holder == 0 && v1a.Holder == sA.ID() {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("victim sessions did not expire: v2 %+v v1a %+v", v2, v1a)
				}
				time.Sleep(20 * time.Millisecond)
			}
			wg.Wait()
			if gotV1a == nil {
				t.Fatal("sA was not granted v1a after v1's expiry")
			}
			churn(60)

			c.Restart(lagger)
			running := c.Running()
			catchUpWait(t, c, running, 30*time.Second)
			want := catchUpTable(t, c.Node(c.Leader()))
			for _, id := range running {
				if got := catchUpTable(t, c.Node(id)); got != want {
					t.Errorf("replica %d (lagger %d) table:\n%s\nleader's:\n%s", id, lagger, got, want)
				}
			}
			if li, err := c.Node(lagger).Leader(testCtx(t, 10*time.Second), "sched"); err != nil || li.Epoch != epoch1 || string(li.Value) != "A" {
				t.Errorf("lagger's leader of sched: %+v %v, want epoch %d value A", li, err, epoch1)
			}

			// Offline: the full tables rebuilt from disk agree.
			c.StopAll()
			var ref string
			var refID uint64
			for _, id := range running {
				got, applied := catchUpOffline(t, backend, c.Config(id).DataDir)
				t.Logf("replica %d rebuilt at %d", id, applied)
				if ref == "" {
					ref, refID = got, id
					continue
				}
				if got != ref {
					t.Errorf("replica %d rebuilt table:\n%s\nreplica %d's:\n%s", id, got, refID, ref)
				}
			}

			for _, id := range c.IDs() {
				c.Restart(id)
			}
			lead = c.WaitLeader(10 * time.Second)
			catchUpWait(t, c, c.IDs(), 30*time.Second)
			want = catchUpTable(t, c.Node(lead))
			for _, id := range c.IDs() {
				if got := catchUpTable(t, c.Node(id)); got != want {
					t.Errorf("after full restart, replica %d table:\n%s\nleader's:\n%s", id, got, want)
				}
			}
			s2 := newSession(t, c.Node(lead), quorumlock.WithTTL(time.Minute))
			var maxTok quorumlock.Token
			for _, l := range held {
				maxTok = max(maxTok, l.Token())
			}
			maxTok = max(maxTok, gotV1a.Token())
			if l := mustAcquire(t, s2, "fresh"); l.Token() <= maxTok {
				t.Errorf("token %d after restart, not above %d", l.Token(), maxTok)
			}
			infos := slices.Collect(func(yield func(quorumlock.LockInfo) bool) {
				for _, name := range []string{"q0", "q1", "q2"} {
					if !yield(holder(t, c.Node(lead), name)) {
						return
					}
				}
			})
			for _, info := range infos {
				if len(info.Waiters) != 0 {
					t.Errorf("expired waiters still queued: %+v", info)
				}
			}
		})
	}
}
