package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// TestReviewCRestartAllRepeatedly restarts a whole three-replica cluster
// several times in a row, on each backend, with frequent snapshots and
// compactions, one replica down (a different one each round) while the
// log moves several snapshots past it, and acquires in flight at the
// moment every replica stops. After every restart: each acknowledged grant
// of every earlier round is still held with its token, each acknowledged
// release is still free, and the next grant's token is above every token
// seen so far (invariants 2 and 10).
func TestReviewCRestartAllRepeatedly(t *testing.T) {
	for _, backend := range []quorumlock.LogBackend{quorumlock.LogPebble, quorumlock.LogWAL} {
		t.Run(string(backend), func(t *testing.T) {
			c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 2 * time.Minute, Configure: func(cfg *quorumlock.Config) {
				cfg.LogBackend = backend
				cfg.SnapshotEntries = 20
			}})
			held := make(map[string]quorumlock.Token) // acknowledged grants that were never released
			freed := make(map[string]bool)            // acknowledged releases
			inflight := make(map[string]bool)         // acquires whose outcome is unknown
			var highest quorumlock.Token
			const rounds = 5
			for r := range rounds {
				lead := c.WaitLeader(10 * time.Second)
				down := follower(c, lead)
				if r%2 == 1 {
					c.Stop(down)
				}
				s := newSession(t, c.Node(lead), quorumlock.WithTTL(2*time.Minute))
				for i := range 60 {
					name := fmt.Sprintf("r%d-%d", r, i%15)
					l := mustAcquire(t, s, name)
					if l.Token() <= highest {
						t.Fatalf("round %d: grant of %s has token %d, not above %d", r, name, l.Token(), highest)
					}
					highest = l.Token()
					if i >= 45 {
						held[name] = l.Token()
						continue
					}
					if err := l.Release(testCtx(t, 5*time.Second)); err != nil {
						t.Fatalf("round %d: release %s: %v", r, name, err)
					}
				}
				for i := range 5 {
					name := fmt.Sprintf("r%d-rel-%d", r, i)
					l := mustAcquire(t, s, name)
					highest = l.Token()
					if err := l.Release(testCtx(t, 5*time.Second)); err != nil {
						t.Fatalf("round %d: release %s: %v", r, name, err)
					}
					freed[name] = true
				}
				if r%2 == 1 {
					c.Restart(down)
				}
				// Acquires in flight while every replica stops.
				var mu sync.Mutex
				var wg sync.WaitGroup
				for i := range 8 {
					name := fmt.Sprintf("r%d-fly-%d", r, i)
					mu.Lock() // the goroutines started before delete from it
					inflight[name] = true
					mu.Unlock()
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						defer cancel()
						if l, err := s.TryAcquire(ctx, name); err == nil {
							mu.Lock()
							held[name] = l.Token()
							delete(inflight, name)
							mu.Unlock()
						}
					}()
				}
				time.Sleep(time.Duration(r) * time.Millisecond)
				c.StopAll()
				wg.Wait()
				for _, id := range c.IDs() {
					c.Restart(id)
				}
				lead = c.WaitLeader(10 * time.Second)
				n := c.Node(lead)
				for name, tok := range held {
					if info := holder(t, n, name); info.Token != tok || info.Holder == 0 {
						t.Fatalf("after restart %d: acknowledged grant of %s (token %d) became %+v", r, name, tok, info)
					}
				}
				for name := range freed {
					if info := holder(t, n, name); info.Holder != 0 {
						t.Fatalf("after restart %d: acknowledged release of %s undone: %+v", r, name, info)
					}
				}
				for name := range inflight {
					if info := holder(t, n, name); info.Token > highest {
						highest = info.Token
					}
				}
				for _, tok := range held {
					highest = max(highest, tok)
				}
			}
		})
	}
}

// TestReviewCStartOnUnusableDataDir: a DataDir that is a file, or whose
// backend directory is a file, makes Start fail with an error (never a
// panic, never a started replica), on each backend.
func TestReviewCStartOnUnusableDataDir(t *testing.T) {
	for _, backend := range []quorumlock.LogBackend{quorumlock.LogPebble, quorumlock.LogWAL} {
		sub := backendDir(backend)
		for _, tc := range []struct {
			name string
			prep func(dir string) string // returns the DataDir
		}{
			{"data dir is a file", func(dir string) string {
				p := filepath.Join(dir, "file")
				if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
					t.Fatal(err)
				}
				return p
			}},
			{"backend dir is a file", func(dir string) string {
				if err := os.WriteFile(filepath.Join(dir, sub), []byte("x"), 0o600); err != nil {
					t.Fatal(err)
				}
				return dir
			}},
		} {
			t.Run(string(backend)+"/"+tc.name, func(t *testing.T) {
				startRefused(t, singleConfig(t, tc.prep(t.TempDir()), backend))
			})
		}
	}
}

// TestReviewCForeignDataDirWAL: the identity check holds on the WAL
// backend too: a directory written by member 1 of cluster alpha is refused
// to member 2 and to member 1 of another cluster, and reopens for its
// owner.
func TestReviewCForeignDataDirWAL(t *testing.T) {
	checkForeignDataDir(t, quorumlock.LogWAL)
}

// backendDir names the directory under DataDir that backend keeps its
// log in.
func backendDir(backend quorumlock.LogBackend) string {
	if backend == quorumlock.LogWAL {
		return "wal"
	}
	return "log"
}

// startRefused checks that Start(cfg) fails with an error: no panic, no
// started replica.
func startRefused(t *testing.T, cfg quorumlock.Config) {
	t.Helper()
	var n *quorumlock.Node
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Start panicked: %v", r)
			}
		}()
		n, err = quorumlock.Start(testCtx(t, 10*time.Second), cfg)
	}()
	if err == nil {
		n.Close()
		t.Fatal("Start succeeded")
	}
	t.Logf("refused: %v", err)
}

// TestReviewCStartWithoutPermissions: Start on a data directory the
// process may not write or read fails with an error (no panic, no hang,
// no started replica), on each backend: a missing DataDir under a parent
// it may not write, an empty DataDir it may not write, and an existing
// replica's directory made read-only or unreadable. Root bypasses file
// permissions, so under root the test runs itself again as nobody.
func TestReviewCStartWithoutPermissions(t *testing.T) {
	t.Parallel()
	if os.Geteuid() == 0 {
		reexecAsNobody(t, "TestReviewCStartWithoutPermissions")
		return
	}
	for _, backend := range []quorumlock.LogBackend{quorumlock.LogPebble, quorumlock.LogWAL} {
		sub := backendDir(backend)
		for _, tc := range []struct {
			name string
			prep func(t *testing.T, dir string) string // returns the DataDir
		}{
			{"parent not writable", func(t *testing.T, dir string) string {
				chmod(t, dir, 0o555)
				return filepath.Join(dir, "data")
			}},
			{"data dir not writable", func(t *testing.T, dir string) string {
				chmod(t, dir, 0o555)
				return dir
			}},
			{"replica dir read-only", func(t *testing.T, dir string) string {
				populate(t, dir, backend, 3)
				chmodAll(t, dir, 0o555, 0o444)
				return dir
			}},
			{"backend dir read-only, files writable", func(t *testing.T, dir string) string {
				populate(t, dir, backend, 3)
				chmodAll(t, filepath.Join(dir, sub), 0o555, 0o644)
				return dir
			}},
			{"backend dir unreadable", func(t *testing.T, dir string) string {
				populate(t, dir, backend, 3)
				chmod(t, filepath.Join(dir, sub), 0)
				return dir
			}},
		} {
			t.Run(string(backend)+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				t.Cleanup(func() { chmodAll(t, dir, 0o755, 0o644) })
				startRefused(t, singleConfig(t, tc.prep(t, dir), backend))
			})
		}
	}
}

func chmod(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// chmodAll sets every directory under root to dirMode and every file to
// fileMode (directories first on the way down, so that it also works
// to restore access).
func chmodAll(t *testing.T, root string, dirMode, fileMode os.FileMode) {
	t.Helper()
	var dirs []string
	_ = os.Chmod(root, 0o755)
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if d != nil && d.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		}
		if d.IsDir() {
			_ = os.Chmod(p, 0o755)
			dirs = append(dirs, p)
			return nil
		}
		_ = os.Chmod(p, fileMode)
		return nil
	})
	for _, d := range slices.Backward(dirs) {
		_ = os.Chmod(d, dirMode)
	}
}

// reexecAsNobody runs test name of this test binary again as user nobody
// (uid and gid 65534), from a copy of the binary nobody may execute, and
// fails t if it fails.
func reexecAsNobody(t *testing.T, name string) {
	t.Helper()
	tmp, err := os.MkdirTemp("", "review-c-nobody")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	chmod(t, tmp, 0o777)
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Skipf("cannot copy the test binary: %v", err)
	}
	bin := filepath.Join(tmp, "test.bin")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run", "^"+name+"$", "-test.count", "1", "-test.v")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "HOME="+tmp, "GOCACHE="+tmp)
	cmd.Dir = tmp
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	t.Logf("as nobody:\n%s", out)
	if err != nil {
		t.Fatalf("as nobody: %v", err)
	}
}

// TestReviewCSecondStartOnSameDataDir: while a replica runs, a second
// Start on its data directory (same process, same config but another
// listener) fails, on each backend: two replicas writing one log would
// corrupt it.
func TestReviewCSecondStartOnSameDataDir(t *testing.T) {
	for _, backend := range []quorumlock.LogBackend{quorumlock.LogPebble, quorumlock.LogWAL} {
		t.Run(string(backend), func(t *testing.T) {
			dir := t.TempDir()
			n, err := quorumlock.Start(testCtx(t, 10*time.Second), singleConfig(t, dir, backend))
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			if n2, err := quorumlock.Start(testCtx(t, 10*time.Second), singleConfig(t, dir, backend)); err == nil {
				n2.HardClose()
				t.Fatal("a second replica started on a data directory in use")
			} else {
				t.Logf("refused: %v", err)
			}
		})
	}
}

// TestReviewCTickIntervalOutOfRangeNamed: a TickInterval that no
// ElectionTicks can make valid (the election timeout, at least 3 ticks,
// must stay below half the SessionTTL) is refused naming TickInterval, the
// field that is out of range, not ElectionTicks, which the caller left at
// its default.
func TestReviewCTickIntervalOutOfRangeNamed(t *testing.T) {
	for _, tc := range []struct {
		tick time.Duration
		ttl  time.Duration
	}{
		{time.Hour, 0},
		{1 << 62, 0},
		{2 * time.Second, 0},                  // default TTL 10 s: 3 ticks = 6 s
		{200 * time.Millisecond, time.Second}, // 3 ticks = 0.6 s
	} {
		cfg := quorumlock.Config{
			ID:           1,
			Peers:        map[uint64]string{1: "127.0.0.1:1"},
			DataDir:      t.TempDir(),
			TickInterval: tc.tick,
			SessionTTL:   tc.ttl,
		}
		n, err := quorumlock.Start(testCtx(t, 5*time.Second), cfg)
		if err == nil {
			n.HardClose()
			t.Fatalf("TickInterval %v: accepted", tc.tick)
		}
		if !errors.Is(err, quorumlock.ErrInvalidConfig) || !strings.Contains(err.Error(), "TickInterval") {
			t.Errorf("TickInterval %v, SessionTTL %v: %v; want ErrInvalidConfig naming TickInterval", tc.tick, tc.ttl, err)
		}
	}
	// The largest tick that can work still starts the check on ElectionTicks.
	cfg := quorumlock.Config{
		ID: 1, Peers: map[uint64]string{1: "127.0.0.1:1"}, DataDir: t.TempDir(),
		TickInterval: time.Second, SessionTTL: 10 * time.Second,
	}
	if _, err := quorumlock.Start(testCtx(t, 5*time.Second), cfg); !errors.Is(err, quorumlock.ErrInvalidConfig) || !strings.Contains(err.Error(), "ElectionTicks") {
		t.Errorf("TickInterval 1s with the default 10 ticks and SessionTTL 10s: %v; want ErrInvalidConfig naming ElectionTicks", err)
	}
}

// TestReviewCMetricsConflictNamesField: a second replica with the same
// member ID registering in the same Prometheus registry fails Start with
// ErrInvalidConfig naming the field, Metrics, like every other bad Config
// field (DESIGN.md, "Bad input").
func TestReviewCMetricsConflictNamesField(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := singleConfig(t, t.TempDir(), quorumlock.LogPebble)
	cfg.Metrics = reg
	n, err := quorumlock.Start(testCtx(t, 10*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	cfg2 := singleConfig(t, t.TempDir(), quorumlock.LogPebble)
	cfg2.Metrics = reg
	n2, err := quorumlock.Start(testCtx(t, 10*time.Second), cfg2)
	if err == nil {
		n2.Close()
		t.Fatal("a second member 1 registered in the same registry")
	}
	if !errors.Is(err, quorumlock.ErrInvalidConfig) || !strings.Contains(err.Error(), "Metrics") {
		t.Fatalf("%v; want ErrInvalidConfig naming Metrics", err)
	}
}

// TestReviewCReplicaOfAnotherClusterOnAMembersAddress: a replica of
// another cluster (same member IDs, another ClusterName) started on the
// address of a stopped member, with its own data directory, is refused by
// the peer handshake: it never learns a leader or joins the log, the
// cluster goes on in the same term (its campaigns do not disturb it), and
// the rightful member rejoins once the stranger is gone.
func TestReviewCReplicaOfAnotherClusterOnAMembersAddress(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: time.Minute})
	lead := c.WaitLeader(10 * time.Second)
	victim := follower(c, lead)
	c.Stop(victim)
	s := newSession(t, c.Node(lead), quorumlock.WithTTL(time.Minute))
	l := mustAcquire(t, s, "before")
	term := c.Node(lead).Status().Term

	cfg := c.Config(victim)
	cfg.ClusterName = "stranger"
	cfg.DataDir = t.TempDir()
	var lis net.Listener
	var err error
	for range 100 {
		if lis, err = net.Listen("tcp", c.Peers()[victim]); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = lis
	stranger, err := quorumlock.Start(testCtx(t, 10*time.Second), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Several election timeouts: the stranger campaigns, the cluster works.
	deadline := time.Now().Add(10 * c.ElectionTimeout())
	for i := 0; time.Now().Before(deadline); i++ {
		mustAcquire(t, s, fmt.Sprint("during-", i))
		time.Sleep(c.ElectionTimeout() / 2)
	}
	if st := stranger.Status(); st.Leader != 0 || st.Commit > 3 {
		t.Errorf("the stranger joined: %+v", st)
	}
	if got := c.Node(lead).Status(); got.Term != term || got.Leader != lead {
		t.Errorf("the cluster was disturbed: leader %d term %d, was %d term %d", got.Leader, got.Term, lead, term)
	}
	if err := stranger.HardClose(); err != nil {
		t.Fatal(err)
	}
	c.Restart(victim)
	deadline = time.Now().Add(10 * time.Second)
	for c.Node(victim).Status().Applied < c.Node(lead).Status().Commit {
		if time.Now().After(deadline) {
			t.Fatalf("the rightful member did not catch up: %+v vs %+v", c.Node(victim).Status(), c.Node(lead).Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if info := holder(t, c.Node(victim), "before"); info.Holder != s.ID() || info.Token != l.Token() {
		t.Fatalf("after the stranger: %+v, want session %d token %d", info, s.ID(), l.Token())
	}
}

// TestReviewCBackendMismatchBothWays: a data directory written with one
// LogBackend is refused (ErrInvalidConfig naming LogBackend) to the other,
// in both directions, without touching it: the rightful backend then
// restarts on it with every acknowledged lock.
func TestReviewCBackendMismatchBothWays(t *testing.T) {
	for _, tc := range []struct{ made, asked quorumlock.LogBackend }{
		{quorumlock.LogWAL, quorumlock.LogPebble},
		{quorumlock.LogPebble, quorumlock.LogWAL},
	} {
		t.Run(string(tc.made)+"-as-"+string(tc.asked), func(t *testing.T) {
			dir := t.TempDir()
			session, tokens := populate(t, dir, tc.made, 3)
			n, err := quorumlock.Start(testCtx(t, 10*time.Second), singleConfig(t, dir, tc.asked))
			if err == nil {
				n.HardClose()
				t.Fatal("started on the other backend's data directory")
			}
			if !errors.Is(err, quorumlock.ErrInvalidConfig) || !strings.Contains(err.Error(), "LogBackend") {
				t.Fatalf("%v; want ErrInvalidConfig naming LogBackend", err)
			}
			n, err = quorumlock.Start(testCtx(t, 10*time.Second), singleConfig(t, dir, tc.made))
			if err != nil {
				t.Fatalf("the rightful backend cannot restart: %v", err)
			}
			defer n.Close()
			for name, tok := range tokens {
				if info := holder(t, n, name); info.Holder != session || info.Token != tok {
					t.Fatalf("%s: %+v, want session %d token %d", name, info, session, tok)
				}
			}
		})
	}
}
