package quorumlock_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
	"github.com/quorumlock/quorumlock/storage"
)

// TestReviewGReadOnlyWALGeneration: with LogWAL, a replica's WAL
// generation directory (DataDir/wal/wal-<generation>) made read-only while
// DataDir/wal and every file stay writable makes Start fail with an error
// naming that directory. Before, Start succeeded (the META rewrite probes
// only DataDir/wal) and the replica stopped at its first segment cut, when
// etcd's WAL could not create the next segment there. Root ignores
// permissions, so under root the test runs itself again as nobody.
func TestReviewGReadOnlyWALGeneration(t *testing.T) {
	if os.Geteuid() == 0 {
		reexecAsNobody(t, "TestReviewGReadOnlyWALGeneration")
		return
	}
	dir := t.TempDir()
	t.Cleanup(func() { chmodAll(t, dir, 0o755, 0o644) })
	populate(t, dir, quorumlock.LogWAL, 3)
	gens, err := filepath.Glob(filepath.Join(dir, "wal", "wal-*"))
	if err != nil || len(gens) != 1 {
		t.Fatalf("WAL generation directories: %v, %v", gens, err)
	}
	chmod(t, gens[0], 0o555)
	n, err := quorumlock.Start(testCtx(t, 10*time.Second), singleConfig(t, dir, quorumlock.LogWAL))
	if err == nil {
		n.Close()
		t.Fatalf("Start succeeded on a read-only %s", gens[0])
	}
	if !strings.Contains(err.Error(), gens[0]) {
		t.Fatalf("Start: %v; want an error naming %s", err, gens[0])
	}
	t.Logf("refused: %v", err)
	// Writable again, the replica starts with its locks.
	chmod(t, gens[0], 0o755)
	n, err = quorumlock.Start(testCtx(t, 10*time.Second), singleConfig(t, dir, quorumlock.LogWAL))
	if err != nil {
		t.Fatalf("Start after restoring the permission: %v", err)
	}
	defer n.Close()
	if info := holder(t, n, "l000"); info.Holder == 0 {
		t.Fatalf("l000 after restart: %+v, want held", info)
	}
	if left, _ := filepath.Glob(filepath.Join(gens[0], "probe*")); len(left) != 0 {
		t.Fatalf("Start left %v behind", left)
	}
}

// damagedStore is a stopped single replica's data directory with
// snapshots taken (SnapshotEntries 16) and, on Pebble, the early log
// flushed into a table (Pebble's Open flushes the log it replays), plus
// what it acknowledged: session holds every lock in tokens.
type damagedStore struct {
	dir     string
	session uint64
	tokens  map[string]quorumlock.Token
}

func newDamagedStore(t *testing.T, backend quorumlock.LogBackend) damagedStore {
	t.Helper()
	dir := t.TempDir()
	session, tokens := populate(t, dir, backend, 40)
	// A second run: Pebble flushes the first run's log into a table and
	// starts a new WAL, which the locks below go into.
	n, err := quorumlock.Start(testCtx(t, 10*time.Second), singleConfig(t, dir, backend))
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(t, n)
	for i := range 5 {
		name := fmt.Sprintf("m%d", i)
		tokens[name] = mustAcquire(t, s, name).Token()
	}
	n.Close()
	return damagedStore{dir: dir, session: session, tokens: tokens}
}

// newest returns the path, relative to DataDir, of the last file (in name
// order) under DataDir/sub whose name matches pattern.
func newest(t *testing.T, dir, sub, pattern string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, sub, pattern))
	if err != nil || len(m) == 0 {
		t.Fatalf("no %s in %s: %v", pattern, filepath.Join(dir, sub), err)
	}
	sort.Strings(m)
	rel, _ := filepath.Rel(dir, m[len(m)-1])
	return rel
}

// flipAt flips one bit of the file at path at the given fraction of its
// used length (up to its last non-zero byte).
func flipAt(t *testing.T, path string, frac float64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[int(float64(used(b))*frac)] ^= 0x10
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}
}

// resealSnapshot damages the lock-table image inside a walstore snapshot
// file and recomputes the file's checksum, following the layout in
// docs/storage.md (magic, version, metadata length and bytes, data length
// and bytes, CRC-32C of all that; integers big-endian): the file passes
// its own check, the image in it does not.
func resealSnapshot(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b[:4]) != "QLWS" {
		t.Fatalf("%s: magic %q", path, b[:4])
	}
	m := int(binary.BigEndian.Uint32(b[8:12]))
	d := int(binary.BigEndian.Uint64(b[12+m : 20+m]))
	data := b[20+m : 20+m+d]
	if len(data) == 0 || 20+m+d+4 != len(b) {
		t.Fatalf("%s: unexpected layout (metadata %d, data %d, file %d bytes)", path, m, d, len(b))
	}
	data[len(data)/2] ^= 0x10
	binary.BigEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], crc32.MakeTable(crc32.Castagnoli)))
	if err := os.WriteFile(path, b, 0o640); err != nil {
		t.Fatal(err)
	}
}

// TestReviewGDamageIsErrCorrupt damages a stopped replica's data directory
// in every way this test can make, one at a time on a fresh copy, on each
// backend: a flipped byte in the middle of a Pebble table, MANIFEST and
// WAL, of an etcd WAL segment, of a snapshot file and of META; a snapshot
// file whose lock-table image is damaged but whose own checksum was
// recomputed; a missing table, MANIFEST, format-version marker, snapshot
// file, META and WAL segment. Start must refuse each with an error that
// wraps storage.ErrCorrupt (the sentinel docs/architecture.md names for
// damaged storage; errors.go has none), not ErrForeignDataDir, and names
// the damaged file (for a table, its number; for the image, the WAL
// directory). A directory of another member or cluster is refused with
// ErrForeignDataDir and not storage.ErrCorrupt.
func TestReviewGDamageIsErrCorrupt(t *testing.T) {
	t.Parallel()
	type damage struct {
		name string
		// do damages dir and returns what the error must contain.
		do func(t *testing.T, dir string) string
	}
	flip := func(sub, pattern string, frac float64) func(t *testing.T, dir string) string {
		return func(t *testing.T, dir string) string {
			rel := newest(t, dir, sub, pattern)
			flipAt(t, filepath.Join(dir, rel), frac)
			return filepath.Base(rel)
		}
	}
	remove := func(sub, pattern string, mention func(base string) string) func(t *testing.T, dir string) string {
		return func(t *testing.T, dir string) string {
			rel := newest(t, dir, sub, pattern)
			if err := os.Remove(filepath.Join(dir, rel)); err != nil {
				t.Fatal(err)
			}
			return mention(filepath.Base(rel))
		}
	}
	same := func(base string) string { return base }
	flipTable := func(frac float64) func(t *testing.T, dir string) string {
		return func(t *testing.T, dir string) string {
			rel := newest(t, dir, "log", "*.sst")
			flipAt(t, filepath.Join(dir, rel), frac)
			return strings.TrimSuffix(filepath.Base(rel), ".sst")
		}
	}
	for _, c := range []struct {
		backend quorumlock.LogBackend
		damages []damage
	}{
		{quorumlock.LogPebble, []damage{
			{"table flipped at 1/4", flipTable(0.25)},
			{"table flipped at 1/2", flipTable(0.5)},
			{"table flipped at 3/4", flipTable(0.75)},
			{"MANIFEST flipped in its first record", flip("log", "MANIFEST-*", 0.25)},
			{"WAL flipped", flip("log", "*.log", 0.5)},
			{"table missing", remove("log", "*.sst", func(b string) string { return strings.TrimSuffix(b, ".sst") })},
			{"MANIFEST missing", remove("log", "MANIFEST-*", same)},
			{"format marker missing", remove("log", "marker.format-version.*", func(string) string { return "format-version marker" })},
		}},
		{quorumlock.LogWAL, []damage{
			{"segment flipped", flip("wal", "wal-*/*.wal", 0.5)},
			{"snapshot file flipped", flip("wal", "*.snap", 0.5)},
			{"META flipped", flip("wal", "META", 0.5)},
			{"snapshot image damaged, file resealed", func(t *testing.T, dir string) string {
				resealSnapshot(t, filepath.Join(dir, newest(t, dir, "wal", "*.snap")))
				return filepath.Join(dir, "wal")
			}},
			{"snapshot file missing", remove("wal", "*.snap", same)},
			{"META missing", remove("wal", "META", same)},
			{"segment missing", remove("wal", "wal-*/*.wal", func(string) string { return "wal-" })},
		}},
	} {
		base := newDamagedStore(t, c.backend)
		for _, d := range c.damages {
			t.Run(string(c.backend)+"/"+d.name, func(t *testing.T) {
				dir := filepath.Join(t.TempDir(), "d")
				copyDir(t, base.dir, dir)
				want := d.do(t, dir)
				n, err := quorumlock.Start(testCtx(t, 10*time.Second), singleConfig(t, dir, c.backend))
				if err == nil {
					n.HardClose()
					t.Fatal("Start succeeded on the damaged directory")
				}
				if !errors.Is(err, storage.ErrCorrupt) || errors.Is(err, quorumlock.ErrForeignDataDir) || !strings.Contains(err.Error(), want) {
					t.Fatalf("Start: %v\nwant storage.ErrCorrupt (not ErrForeignDataDir) naming %q", err, want)
				}
				t.Logf("refused: %v", err)
			})
		}
		t.Run(string(c.backend)+"/foreign", func(t *testing.T) {
			for _, mutate := range []func(*quorumlock.Config){
				func(cfg *quorumlock.Config) { cfg.ID = 2; cfg.Peers = map[uint64]string{2: cfg.Peers[1]} },
				func(cfg *quorumlock.Config) { cfg.ClusterName = "another" },
			} {
				cfg := singleConfig(t, base.dir, c.backend)
				mutate(&cfg)
				n, err := quorumlock.Start(testCtx(t, 10*time.Second), cfg)
				if err == nil {
					n.HardClose()
					t.Fatal("Start succeeded on another member's directory")
				}
				if !errors.Is(err, quorumlock.ErrForeignDataDir) || errors.Is(err, storage.ErrCorrupt) {
					t.Fatalf("Start: %v; want ErrForeignDataDir and not storage.ErrCorrupt", err)
				}
			}
			// The owner still starts on it, with every acknowledged lock.
			n, err := quorumlock.Start(testCtx(t, 10*time.Second), singleConfig(t, base.dir, c.backend))
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			for name, tok := range base.tokens {
				if info := holder(t, n, name); info.Token != tok || info.Holder == 0 {
					t.Fatalf("%s after restart: %+v, want token %d", name, info, tok)
				}
			}
		})
	}
}

// TestReviewGRemoteSessionSurvivesWholeClusterRestart: on the WAL backend
// with snapshots every 20 entries (each replica's DataDir/wal holds a
// snapshot file before the restart), every replica is stopped at once
// (HardClose, as a crash) and restarted, well within the TTL of a remote
// client's session. The session lives on: its locks are held with their
// tokens and their Lost channels stay open, the locks it released are
// free, its Done stays open, and its next grant carries a token above
// every earlier one.
func TestReviewGRemoteSessionSurvivesWholeClusterRestart(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{SessionTTL: 10 * time.Second, Configure: func(cfg *quorumlock.Config) {
		cfg.LogBackend = quorumlock.LogWAL
		cfg.SnapshotEntries = 20
	}})
	c.WaitLeader(5 * time.Second)
	var addrs []string
	for _, id := range c.IDs() {
		addrs = append(addrs, c.Peers()[id])
	}
	cl, err := quorumlock.Dial(testCtx(t, 10*time.Second), addrs, quorumlock.WithElectionTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s := newSession(t, cl, quorumlock.WithTTL(10*time.Second))
	var kept []*quorumlock.Lock
	var released []string
	var top quorumlock.Token
	for i := range 30 {
		l := mustAcquire(t, s, fmt.Sprintf("r%02d", i))
		top = max(top, l.Token())
		if i%3 == 0 {
			kept = append(kept, l)
			continue
		}
		if err := l.Release(testCtx(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		released = append(released, l.Name())
	}
	c.StopAll()
	for _, id := range c.IDs() {
		if snaps, _ := filepath.Glob(filepath.Join(c.Config(id).DataDir, "wal", "*.snap")); len(snaps) == 0 {
			t.Fatalf("replica %d took no snapshot", id)
		}
	}
	for _, id := range c.IDs() {
		c.Restart(id)
	}
	c.WaitLeader(10 * time.Second)
	for _, l := range kept {
		if info := holder(t, cl, l.Name()); info.Holder != s.ID() || info.Token != l.Token() {
			t.Fatalf("%s after the restart: %+v, want session %d token %d", l.Name(), info, s.ID(), l.Token())
		}
		if closed(l.Lost()) {
			t.Fatalf("%s: Lost closed by the restart", l.Name())
		}
	}
	for _, name := range released {
		if info := holder(t, cl, name); info.Holder != 0 {
			t.Fatalf("released %s after the restart: %+v, want free", name, info)
		}
	}
	if l := mustAcquire(t, s, "after"); l.Token() <= top {
		t.Fatalf("token after the restart %d, not above %d", l.Token(), top)
	}
	if closed(s.Done()) {
		t.Fatal("session ended by the restart")
	}
}
