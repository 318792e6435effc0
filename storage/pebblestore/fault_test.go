package pebblestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/storage"
)

// The fault tests damage the files of a store on an in-memory file system and
// check what Open makes of it. A store written in one session keeps all its
// records in Pebble's WAL (Close does not flush the memtable), so the WAL is
// the raft log on disk.

// saveEach saves entries lo..hi one Save each, every one with a hard state
// committing it. Each entry carries 80 bytes of padding so that its data is
// easy to find in a file.
func saveEach(t *testing.T, s *Store, lo, hi uint64) {
	t.Helper()
	for i := lo; i <= hi; i++ {
		if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(i)}, []*raftpb.Entry{paddedEntry(i)}); err != nil {
			t.Fatalf("Save(%d): %v", i, err)
		}
	}
}

func paddedEntry(i uint64) *raftpb.Entry {
	return testEntry(i, 1, fmt.Sprintf("entry %d|%s", i, strings.Repeat("x", 80)))
}

// checkIntact checks that the log is exactly entries 1..last as saveEach
// wrote them and that the hard state commits last.
func checkIntact(t *testing.T, s *Store, last uint64) {
	t.Helper()
	if got, err := s.LastIndex(); err != nil || got != last {
		t.Fatalf("LastIndex() = %d, %v; want %d", got, err, last)
	}
	ents, err := s.Entries(1, last+1, noLimitSize)
	if err != nil {
		t.Fatalf("Entries(1, %d): %v", last+1, err)
	}
	for k, e := range ents {
		if want := paddedEntry(uint64(k) + 1); !bytes.Equal(e.GetData(), want.GetData()) || e.GetIndex() != want.GetIndex() {
			t.Fatalf("entry %d = %v, want %v", k+1, e, want)
		}
	}
	if hs, _, err := s.InitialState(); err != nil || hs.GetCommit() != last {
		t.Fatalf("hard state = %v, %v; want commit %d", hs, err, last)
	}
}

// newestFile returns the name of the newest file in dir with the suffix.
func newestFile(t *testing.T, fs vfs.FS, dir, suffix string) string {
	t.Helper()
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	var matching []string
	for _, n := range names {
		if strings.HasSuffix(n, suffix) {
			matching = append(matching, n)
		}
	}
	if len(matching) == 0 {
		t.Fatalf("no %s file in %s: %v", suffix, dir, names)
	}
	slices.Sort(matching)
	return matching[len(matching)-1]
}

// fileData returns the contents of a MemFS file, which the test may modify
// in place.
func fileData(t *testing.T, fs *vfs.MemFS, path string) []byte {
	t.Helper()
	b, err := fs.UnsafeGetFileDataBuffer(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// truncateFile cuts the last n bytes off a MemFS file.
func truncateFile(t *testing.T, fs *vfs.MemFS, path string, n int) {
	t.Helper()
	data := bytes.Clone(fileData(t, fs, path))
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data[:len(data)-n]); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		t.Fatal(err)
	}
}

// TestTornWALTail damages the last record of the newest WAL the way a crash
// in the middle of its write does: Open must succeed, drop only that record
// (its Save never returned), keep everything before it intact, and accept
// writes again.
func TestTornWALTail(t *testing.T) {
	for _, c := range []struct {
		name   string
		reopen bool // write the records in a second session (Pebble's newer WAL chunk format)
		tear   func(t *testing.T, fs *vfs.MemFS, path string)
	}{
		{"truncated", false, func(t *testing.T, fs *vfs.MemFS, path string) { truncateFile(t, fs, path, 30) }},
		{"zeroed", false, func(t *testing.T, fs *vfs.MemFS, path string) {
			b := fileData(t, fs, path)
			clear(b[len(b)-40:])
		}},
		{"truncated/sync chunks", true, func(t *testing.T, fs *vfs.MemFS, path string) { truncateFile(t, fs, path, 30) }},
		{"zeroed/sync chunks", true, func(t *testing.T, fs *vfs.MemFS, path string) {
			b := fileData(t, fs, path)
			clear(b[len(b)-40:])
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := vfs.NewMem()
			s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
			if c.reopen {
				_ = s.Close()
				s = openT(t, "db", Options{FS: fs}, defaultCacheLimits)
			}
			saveEach(t, s, 1, 20)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			wal := "db/" + newestFile(t, fs, "db", ".log")
			c.tear(t, fs, wal)

			s, err := Open("db", Options{FS: fs})
			if err != nil {
				t.Fatalf("Open after a torn final record: %v", err)
			}
			checkIntact(t, s, 19)
			saveEach(t, s, 20, 25)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openT(t, "db", Options{FS: fs}, defaultCacheLimits)
			defer func() { _ = s.Close() }()
			checkIntact(t, s, 25)
		})
	}
}

// TestCorruptWALRecord flips a byte inside an earlier record of the WAL:
// Open must fail with storage.ErrCorrupt naming the WAL file, instead of
// taking the damage for a torn tail and dropping every acknowledged record
// after it (which Pebble alone does within the WAL's last 32 KiB block).
func TestCorruptWALRecord(t *testing.T) {
	for _, c := range []struct {
		name    string
		reopen  bool
		entries uint64
		victim  uint64
	}{
		{"first WAL, last block", false, 20, 5},
		{"sync chunks, last block", true, 20, 5},
		{"sync chunks, earlier block", true, 600, 5},
		{"sync chunks, last block of many", true, 600, 590},
		{"second to last record", true, 20, 19},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := vfs.NewMem()
			s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
			if c.reopen {
				_ = s.Close()
				s = openT(t, "db", Options{FS: fs}, defaultCacheLimits)
			}
			saveEach(t, s, 1, c.entries)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			name := newestFile(t, fs, "db", ".log")
			b := fileData(t, fs, "db/"+name)
			at := bytes.Index(b, fmt.Appendf(nil, "entry %d|", c.victim))
			if at < 0 {
				t.Fatalf("entry %d not found in %s", c.victim, name)
			}
			b[at+20] ^= 0x04

			s, err := Open("db", Options{FS: fs})
			if err == nil {
				last, _ := s.LastIndex()
				_ = s.Close()
				t.Fatalf("Open succeeded with LastIndex %d; entries %d..%d were acknowledged", last, c.victim, c.entries)
			}
			if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), name) {
				t.Fatalf("err = %v, want storage.ErrCorrupt naming %s", err, name)
			}
		})
	}
}

// TestCorruptTable flips a byte in a flushed sstable, in the block of log
// entries and in the block of the snapshot: Open reads every record, so it
// fails with storage.ErrCorrupt naming the sstable. Entry and snapshot data
// are random, so that Pebble's block compression leaves them verbatim and the
// test can find them in the file.
func TestCorruptTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	random := func(n int) []byte {
		b := make([]byte, n)
		for k := range b {
			b[k] = byte(rng.Uint32())
		}
		return b
	}
	var ents []*raftpb.Entry
	for i := uint64(1); i <= 200; i++ {
		ents = append(ents, &raftpb.Entry{Index: new(i), Term: new(uint64(1)), Data: random(100)})
	}
	snapData := random(64 << 10)
	for _, c := range []struct {
		name   string
		needle []byte
	}{
		{"log entry", ents[149].GetData()[40:56]},
		{"snapshot data", snapData[30000:30016]},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := vfs.NewMem()
			s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
			if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(200))}, ents); err != nil {
				t.Fatal(err)
			}
			snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(150)), Term: new(uint64(1))}, Data: snapData}
			if err := s.SaveSnapshot(snap); err != nil {
				t.Fatal(err)
			}
			if err := s.db.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			name := newestFile(t, fs, "db", ".sst")
			b := fileData(t, fs, "db/"+name)
			at := bytes.Index(b, c.needle)
			if at < 0 {
				t.Fatalf("%s data not found in %s", c.name, name)
			}
			b[at+3] ^= 0x01

			s, err := Open("db", Options{FS: fs})
			if err == nil {
				_ = s.Close()
				t.Fatal("Open succeeded")
			}
			num := strings.TrimSuffix(name, ".sst")
			if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), num) {
				t.Fatalf("err = %v, want storage.ErrCorrupt naming table %s", err, num)
			}
			t.Logf("Open: %v", err)
		})
	}
}

// TestSyncFailureLosesNothing fails the fsync of a Save on a file system that
// can crash: the Save reports the failure, the store refuses writes, and
// after a crash the store holds exactly what was acknowledged before.
func TestSyncFailureLosesNothing(t *testing.T) {
	mem := vfs.NewCrashableMem()
	fs, toggle := wrapFailingSync(mem)
	s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
	saveEach(t, s, 1, 10)

	toggle.On()
	err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(11))}, []*raftpb.Entry{paddedEntry(11)})
	if !errors.Is(err, errorfs.ErrInjected) {
		t.Fatalf("Save with a failing fsync: err = %v, want errorfs.ErrInjected", err)
	}
	toggle.Off()
	if err := s.Save(nil, []*raftpb.Entry{paddedEntry(11)}); !errors.Is(err, errorfs.ErrInjected) {
		t.Fatalf("Save after the failure: err = %v, want the sticky errorfs.ErrInjected", err)
	}
	checkIntact(t, s, 10)

	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = s.Close()
	s = openT(t, "db", Options{FS: crashed}, defaultCacheLimits)
	defer func() { _ = s.Close() }()
	checkIntact(t, s, 10)
}

func wrapFailingSync(fs vfs.FS) (vfs.FS, *errorfs.Toggle) {
	toggle := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasSuffix(op.Path, ".log") &&
			(op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo) {
			return errorfs.ErrInjected
		}
		return nil
	})}
	return errorfs.Wrap(fs, toggle), toggle
}

// TestPowerLoss simulates power failures while a writer saves, takes
// snapshots and compacts: at random moments the file system is cloned with a
// random part of its unsynced data (torn writes included). The clone must
// open, and hold every write that had returned before the clone was taken.
func TestPowerLoss(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 8 {
		mem := vfs.NewCrashableMem()
		s := openT(t, "db", Options{FS: mem}, defaultCacheLimits)
		var saved, snapped, compacted atomic.Uint64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		errc := make(chan error, 1)
		go func() {
			defer wg.Done()
			errc <- powerLossWriter(s, stop, &saved, &snapped, &compacted)
		}()
		for crash := range 3 {
			for saved.Load() < uint64(20*(crash+1)) {
				select {
				case err := <-errc:
					t.Fatalf("writer: %v", err)
				default:
				}
			}
			ackSaved, ackSnap, ackCompact := saved.Load(), snapped.Load(), compacted.Load()
			clone := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: rng.IntN(101), RNG: rng})
			c, err := Open("db", Options{FS: clone})
			if err != nil {
				t.Fatalf("round %d crash %d: Open: %v", round, crash, err)
			}
			checkPowerLoss(t, c, ackSaved, ackSnap, ackCompact)
			_ = c.Close()
		}
		close(stop)
		wg.Wait()
		if err := <-errc; err != nil {
			t.Fatalf("writer: %v", err)
		}
		_ = s.Close()
	}
}

func powerLossWriter(s *Store, stop <-chan struct{}, saved, snapped, compacted *atomic.Uint64) error {
	for i := uint64(1); ; i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(i)}, []*raftpb.Entry{paddedEntry(i)}); err != nil {
			return err
		}
		saved.Store(i)
		if i%9 != 0 {
			continue
		}
		snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(i), Term: new(uint64(1))},
			Data: fmt.Appendf(nil, "state at %d", i)}
		if err := s.SaveSnapshot(snap); err != nil {
			return err
		}
		snapped.Store(i)
		if err := s.Compact(i - 4); err != nil {
			return err
		}
		compacted.Store(i - 4)
	}
}

func checkPowerLoss(t *testing.T, s *Store, saved, snapped, compacted uint64) {
	t.Helper()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	hs, _, _ := s.InitialState()
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	si := snap.GetMetadata().GetIndex()
	if last < saved || hs.GetCommit() < saved || hs.GetCommit() > last || first-1 < compacted || si < snapped || si < first-1 || si > last {
		t.Fatalf("after power loss: log [%d, %d], commit %d, snapshot %d; acknowledged: saved %d, snapshot %d, compacted %d",
			first, last, hs.GetCommit(), si, saved, snapped, compacted)
	}
	if si > 0 && string(snap.GetData()) != fmt.Sprintf("state at %d", si) {
		t.Fatalf("snapshot at %d holds %q", si, snap.GetData())
	}
	ents, err := s.Entries(first, last+1, noLimitSize)
	if err != nil {
		t.Fatal(err)
	}
	for k, e := range ents {
		if want := paddedEntry(first + uint64(k)); !bytes.Equal(e.GetData(), want.GetData()) {
			t.Fatalf("entry %d = %q, want %q", first+uint64(k), e.GetData(), want.GetData())
		}
	}
}

// TestIdentityOfAnotherMember opens the data directory of one member as
// another: SetIdentity reports the mismatch, naming both, and changes
// nothing.
func TestIdentityOfAnotherMember(t *testing.T) {
	fs := vfs.NewMem()
	s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
	mine := storage.Identity{ClusterID: 0xabc, MemberID: 1}
	if err := s.SetIdentity(mine); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s = openT(t, "db", Options{FS: fs}, defaultCacheLimits)
	defer func() { _ = s.Close() }()
	for _, other := range []storage.Identity{{ClusterID: 0xabc, MemberID: 2}, {ClusterID: 0xdef, MemberID: 1}} {
		err := s.SetIdentity(other)
		if !errors.Is(err, storage.ErrIdentityMismatch) ||
			!strings.Contains(err.Error(), fmt.Sprintf("cluster %x member %x", mine.ClusterID, mine.MemberID)) ||
			!strings.Contains(err.Error(), fmt.Sprintf("cluster %x member %x", other.ClusterID, other.MemberID)) {
			t.Fatalf("SetIdentity(%v): err = %v, want ErrIdentityMismatch naming both identities", other, err)
		}
	}
	if got, ok, err := s.Identity(); got != mine || !ok || err != nil {
		t.Fatalf("Identity() = %v, %v, %v; want %v", got, ok, err, mine)
	}
}

// TestCommitOnlySaveIsDeferred: a Save that only moves the commit index
// (raft.MustSync false) writes nothing, so a failing fsync does not fail
// it; InitialState reports it; the next Save writes it (here one that must
// sync, a new term, and fails); after a crash the store holds what the
// synced writes acknowledged.
func TestCommitOnlySaveIsDeferred(t *testing.T) {
	mem := vfs.NewCrashableMem()
	fs, toggle := wrapFailingSync(mem)
	s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
	saveEach(t, s, 1, 10)
	if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(9))}, nil); err != nil {
		t.Fatal(err)
	}
	saveEach(t, s, 11, 11)

	toggle.On()
	if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(11))}, nil); err != nil {
		t.Fatalf("commit-only Save with a failing fsync: %v (it must not write)", err)
	}
	if hs, _, err := s.InitialState(); err != nil || hs.GetCommit() != 11 {
		t.Fatalf("InitialState after a commit-only Save: %v, %v", hs, err)
	}
	if err := s.Save(&raftpb.HardState{Term: new(uint64(2)), Commit: new(uint64(11))}, nil); !errors.Is(err, errorfs.ErrInjected) {
		t.Fatalf("Save of a new term with a failing fsync: err = %v, want errorfs.ErrInjected", err)
	}
	toggle.Off()

	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = s.Close()
	s = openT(t, "db", Options{FS: crashed}, defaultCacheLimits)
	defer func() { _ = s.Close() }()
	checkIntact(t, s, 11)
}

// TestPowerLossAfterCommitOnlySaves: a leader makes many commit-only Saves
// in a row after its last entries. A power loss that keeps a random part of
// the unsynced data must find a store that opens (the WAL check on open
// takes a damaged record followed by a valid one for corruption, so no
// write may be left unsynced) with every acknowledged entry.
func TestPowerLossAfterCommitOnlySaves(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	for round := range 10 {
		n := uint64(100 + 200*round)
		mem := vfs.NewCrashableMem()
		s := openT(t, "db", Options{FS: mem}, defaultCacheLimits)
		for i := uint64(1); i <= n; i++ {
			if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(0))}, []*raftpb.Entry{paddedEntry(i)}); err != nil {
				t.Fatal(err)
			}
		}
		for c := uint64(1); c <= n; c++ {
			if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(c)}, nil); err != nil {
				t.Fatal(err)
			}
		}
		clone := mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rng})
		_ = s.Close()
		c, err := Open("db", Options{FS: clone})
		if err != nil {
			t.Fatalf("round %d: Open after a power loss following %d commit-only Saves: %v", round, n, err)
		}
		if last, _ := c.LastIndex(); last != n {
			t.Errorf("round %d: LastIndex %d, want %d", round, last, n)
		}
		_ = c.Close()
	}
}

// TestSnapshotAfterCommitOnlySave: a snapshot this replica took at an index
// only a deferred commit-only Save covers writes that hard state in the
// same batch: after a crash the commit index is not below the snapshot
// (raft refuses to start from a snapshot above its commit index).
func TestSnapshotAfterCommitOnlySave(t *testing.T) {
	mem := vfs.NewCrashableMem()
	s := openT(t, "db", Options{FS: mem}, defaultCacheLimits)
	for i := uint64(1); i <= 10; i++ {
		if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(min(i, 5))}, []*raftpb.Entry{paddedEntry(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(10))}, nil); err != nil {
		t.Fatal(err)
	}
	snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(10)), Term: new(uint64(1)), ConfState: &raftpb.ConfState{Voters: []uint64{1}}}, Data: []byte("state at 10")}
	if err := s.SaveSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = s.Close()
	s = openT(t, "db", Options{FS: crashed}, defaultCacheLimits)
	defer func() { _ = s.Close() }()
	if hs, _, err := s.InitialState(); err != nil || hs.GetCommit() < 10 {
		t.Fatalf("InitialState after a crash: %v, %v; want commit >= the snapshot's index 10", hs, err)
	}
}

// TestFlushFailureStopsWrites makes every flush fail with ENOSPC (a full
// disk under a WAL that still has room). Pebble only logs a failed flush and
// retries it; once the memtables fill, it stalls every commit until a flush
// succeeds, so without the store's BackgroundError hook a Save would block
// forever and the replica would hang instead of stopping. The store must
// instead turn the failure into its sticky write error before that, and lose
// nothing it acknowledged.
func TestFlushFailureStopsWrites(t *testing.T) {
	mem := vfs.NewMem()
	toggle := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasSuffix(op.Path, ".sst") && (op.Kind == errorfs.OpCreate || op.Kind == errorfs.OpFileWrite) {
			return syscall.ENOSPC
		}
		return nil
	})}
	s := openT(t, "db", Options{FS: errorfs.Wrap(mem, toggle)}, defaultCacheLimits)
	toggle.On()

	// 60 KiB entries: two 8 MiB memtables (Pebble's stall threshold) hold
	// fewer than 300, so 1000 Saves reach the stall if the failure is missed.
	type result struct {
		acked uint64
		err   error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.acked, r.err = saveUntilError(s, 1, 1000)
		done <- r
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(2 * time.Minute): // a hang detector, not a timing assertion
		t.Fatal("Save blocked: the failed flushes were not reported")
	}
	if !errors.Is(r.err, syscall.ENOSPC) {
		t.Fatalf("Saves with failing flushes: %d acknowledged, then err = %v; want an error wrapping ENOSPC", r.acked, r.err)
	}
	if err := s.Save(nil, []*raftpb.Entry{bigEntry(r.acked + 1)}); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Save after the failure: err = %v, want the sticky ENOSPC", err)
	}
	_ = s.Close()

	// With space again, the store reopens with every acknowledged entry
	// (and perhaps the failed Save's: it may have reached the WAL).
	toggle.Off()
	s = openT(t, "db", Options{FS: mem}, defaultCacheLimits)
	defer func() { _ = s.Close() }()
	checkReopened(t, s, 1, r.acked)
	if hs, _, err := s.InitialState(); err != nil || hs.GetCommit() < r.acked {
		t.Fatalf("hard state = %v, %v; want commit %d or more", hs, err, r.acked)
	}
}

// TestWALCreateFailureStopsWrites makes the creation (and reuse) of Pebble's
// next WAL file fail, as a full disk or a process out of file descriptors
// does. Pebble opens it while it switches memtables inside a commit and
// panics when that fails, in a way no recover can catch (the panic unlocks
// a mutex twice): the whole process died. The store must instead fail the
// Save, refuse later writes, and reopen with every acknowledged entry.
func TestWALCreateFailureStopsWrites(t *testing.T) {
	for _, cause := range []error{syscall.ENOSPC, syscall.EMFILE} {
		t.Run(cause.Error(), func(t *testing.T) {
			mem := vfs.NewMem()
			toggle := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
				if strings.HasSuffix(op.Path, ".log") && (op.Kind == errorfs.OpCreate || op.Kind == errorfs.OpReuseForWrite) {
					return cause
				}
				return nil
			})}
			fs := errorfs.Wrap(mem, toggle)
			s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
			saveEach(t, s, 1, 3)

			// 60 KiB entries fill Pebble's first memtable (256 KiB) within
			// a few Saves, and 1000 of them fill several.
			toggle.On()
			acked, err := saveUntilError(s, 4, 1000)
			if !errors.Is(err, cause) || !strings.Contains(err.Error(), ".log") {
				t.Fatalf("Saves while no WAL file can be created: %d acknowledged, then err = %v; want an error wrapping %v naming the WAL", acked, err, cause)
			}
			if err := s.Save(nil, []*raftpb.Entry{bigEntry(acked + 1)}); !errors.Is(err, cause) {
				t.Fatalf("Save after the failure: err = %v, want the sticky %v", err, cause)
			}
			_ = s.Close()

			// Open fails the same way while WAL files cannot be created.
			if s, err := Open("db", Options{FS: fs}); !errors.Is(err, cause) {
				if err == nil {
					_ = s.Close()
				}
				t.Fatalf("Open while no WAL file can be created: err = %v, want %v", err, cause)
			}

			toggle.Off()
			s = openT(t, "db", Options{FS: fs}, defaultCacheLimits)
			defer func() { _ = s.Close() }()
			last := checkReopened(t, s, 4, acked)
			// And the store works again.
			if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(last + 1)}, []*raftpb.Entry{bigEntry(last + 1)}); err != nil {
				t.Fatalf("Save after reopening: %v", err)
			}
		})
	}
}

// TestMetadataFailureLeavesStoreOpenable fails the sync of Pebble's MANIFEST,
// or of the store's directory, while Saves go on. Pebble reports these
// through Logger.Fatalf, which is meant to end the process; the store's
// returns, and Pebble used to go on from there: it retried the flush and
// recorded the same keys in a second table, so that every later Open
// panicked in a compaction (and a failed directory sync while switching
// WALs panicked at once). The store must stop with the error, and a reopened
// store must hold every acknowledged entry and compact without trouble.
func TestMetadataFailureLeavesStoreOpenable(t *testing.T) {
	for _, c := range []struct {
		name string
		fail func(op errorfs.Op) bool
	}{
		{"manifest-sync", func(op errorfs.Op) bool {
			return strings.Contains(op.Path, "MANIFEST") && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData)
		}},
		{"manifest-write", func(op errorfs.Op) bool {
			return strings.Contains(op.Path, "MANIFEST") && op.Kind == errorfs.OpFileWrite
		}},
		{"dir-sync", func(op errorfs.Op) bool {
			return op.Path == "db" && op.Kind == errorfs.OpFileSync
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem := vfs.NewMem()
			toggle := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
				if c.fail(op) {
					return syscall.EIO
				}
				return nil
			})}
			fs := errorfs.Wrap(mem, toggle)
			s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
			saveEach(t, s, 1, 3)

			toggle.On()
			acked, err := saveUntilError(s, 4, 1000)
			if !errors.Is(err, syscall.EIO) {
				t.Fatalf("Saves with failing %s: %d acknowledged, then err = %v; want EIO", c.name, acked, err)
			}
			_ = s.Close()

			toggle.Off()
			s = openT(t, "db", Options{FS: fs}, defaultCacheLimits)
			defer func() { _ = s.Close() }()
			if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, false); err != nil {
				t.Fatalf("compacting the reopened store: %v", err)
			}
			last := checkReopened(t, s, 4, acked)
			if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(last + 1)}, []*raftpb.Entry{bigEntry(last + 1)}); err != nil {
				t.Fatalf("Save after reopening: %v", err)
			}
		})
	}
}

// TestOpenWithFailingFlush opens a store whose log must be flushed while
// every table write fails with ENOSPC: a replica restarted on a full disk.
// Pebble's Open waits for that flush and retries it at once and forever,
// so Open never returned (a hot loop; the replica hung in Start). Open must
// fail with the error instead, and a later start with space again (a new
// process: here a copy of the files) must find every entry.
func TestOpenWithFailingFlush(t *testing.T) {
	mem := vfs.NewCrashableMem()
	s := openT(t, "db", Options{FS: mem}, defaultCacheLimits)
	saveEach(t, s, 1, 50)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	toggle := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasSuffix(op.Path, ".sst") && (op.Kind == errorfs.OpCreate || op.Kind == errorfs.OpFileWrite) {
			return syscall.ENOSPC
		}
		return nil
	})}
	toggle.On()
	type opened struct {
		s   *Store
		err error
	}
	done := make(chan opened, 1)
	go func() {
		s, err := Open("db", Options{FS: errorfs.Wrap(mem, toggle)})
		done <- opened{s, err}
	}()
	var o opened
	select {
	case o = <-done:
	case <-time.After(2 * time.Minute): // a hang detector, not a timing assertion
		t.Fatal("Open hangs while its flush keeps failing")
	}
	if o.err == nil {
		_ = o.s.Close()
		t.Fatal("Open with failing flushes succeeded; want ENOSPC")
	}
	if !errors.Is(o.err, syscall.ENOSPC) || !strings.Contains(o.err.Error(), "db") {
		t.Fatalf("Open with failing flushes: %v; want an error wrapping ENOSPC naming the directory", o.err)
	}

	// With space again, the store opens in the same process (the given-up
	// Pebble is parked and changes nothing) with every entry.
	toggle.Off()
	s = openT(t, "db", Options{FS: errorfs.Wrap(mem, toggle)}, defaultCacheLimits)
	defer func() { _ = s.Close() }()
	checkIntact(t, s, 50)
	saveEach(t, s, 51, 60)
	checkIntact(t, s, 60)
}

// TestFailedStoreThrottlesRetries checks that once a flush failed, Pebble's
// retries (at once and forever: a failed store spun a processor until it
// was closed, over a second of CPU per second) go through the fence's pause
// before each table they try to create.
func TestFailedStoreThrottlesRetries(t *testing.T) {
	paused := make(chan struct{}, 1)
	toggle := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasSuffix(op.Path, ".sst") && op.Kind == errorfs.OpCreate {
			return syscall.ENOSPC
		}
		return nil
	})}
	opts := Options{FS: errorfs.Wrap(vfs.NewMem(), toggle), retryPause: func() {
		select {
		case paused <- struct{}{}:
		default:
		}
	}}
	s := openT(t, "db", opts, defaultCacheLimits)
	defer func() { _ = s.Close() }()
	toggle.On()
	_, err := saveUntilError(s, 1, 1000)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Saves with failing flushes: err = %v, want ENOSPC", err)
	}
	select {
	case <-paused:
	case <-time.After(2 * time.Minute): // a hang detector, not a timing assertion
		t.Fatal("Pebble's retries of the failed flush never paused")
	}
}

// bigSnapshot returns a snapshot at index i whose data (6 MiB) is more than
// half a memtable: Pebble writes such a batch to the current WAL, then
// switches to a new WAL and queues the batch for a flush of its own.
func bigSnapshot(i uint64) *raftpb.Snapshot {
	return &raftpb.Snapshot{Data: bytes.Repeat([]byte{'s'}, 6<<20), Metadata: &raftpb.SnapshotMetadata{Index: new(i), Term: new(uint64(1))}}
}

// TestLargeWriteOnFailingWAL saves a snapshot larger than half a memtable
// while every WAL write fails with ENOSPC. Pebble writes the batch to the
// current WAL and then closes that WAL to switch to a new one; the close
// fails (it flushes the batch) and Pebble panics, in a way no recover
// catches: saving a big snapshot on a nearly full disk killed the process.
// The store must fail the write, and reopen with every acknowledged entry
// (the failed WAL must stay the newest: Pebble refuses a torn older one).
func TestLargeWriteOnFailingWAL(t *testing.T) {
	mem := vfs.NewMem()
	toggle := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if strings.HasSuffix(op.Path, ".log") && op.Kind == errorfs.OpFileWrite {
			return syscall.ENOSPC
		}
		return nil
	})}
	s := openT(t, "db", Options{FS: errorfs.Wrap(mem, toggle)}, defaultCacheLimits)
	saveEach(t, s, 1, 10)

	toggle.On()
	if err := s.SaveSnapshot(bigSnapshot(10)); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("SaveSnapshot with a failing WAL: err = %v, want ENOSPC", err)
	}
	if err := s.Save(nil, []*raftpb.Entry{paddedEntry(11)}); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Save after the failure: err = %v, want the sticky ENOSPC", err)
	}
	_ = s.Close()

	toggle.Off()
	s = openT(t, "db", Options{FS: mem}, defaultCacheLimits)
	defer func() { _ = s.Close() }()
	checkIntact(t, s, 10)
}

// TestStalledWriteFailsWithFlush holds Pebble's flush of a big snapshot,
// saves another big snapshot meanwhile, then makes the held flush fail
// with ENOSPC. With Pebble's default threshold, the second SaveSnapshot
// waited in Pebble's write stall for that flush, which could now never
// succeed: the Save blocked for good and the replica hung. The store must
// not stall there, and must fail (sticky ENOSPC) once the flush has failed.
func TestStalledWriteFailsWithFlush(t *testing.T) {
	mem := vfs.NewMem()
	var hold atomic.Bool
	gate := make(chan struct{})
	held := make(chan struct{}, 1)
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !strings.HasSuffix(op.Path, ".sst") || op.Kind != errorfs.OpCreate || !hold.Load() {
			return nil
		}
		select {
		case held <- struct{}{}:
		default:
		}
		<-gate
		return syscall.ENOSPC
	})
	s := openT(t, "db", Options{FS: errorfs.Wrap(mem, inj)}, defaultCacheLimits)
	saveEach(t, s, 1, 40)

	hold.Store(true)
	if err := s.SaveSnapshot(bigSnapshot(10)); err != nil {
		t.Fatalf("first SaveSnapshot: %v", err)
	}
	select {
	case <-held:
	case <-time.After(2 * time.Minute): // a hang detector, not a timing assertion
		t.Fatal("the big snapshot was never flushed")
	}
	// Two more big snapshots queue over 16 MiB of memtables behind the
	// held flush, Pebble's default stall threshold.
	done := make(chan error, 1)
	go func() {
		err := s.SaveSnapshot(bigSnapshot(20))
		if err == nil {
			err = s.SaveSnapshot(bigSnapshot(30))
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("SaveSnapshot while a flush is held: %v", err)
		}
	case <-time.After(2 * time.Minute): // a hang detector, not a timing assertion
		close(gate)
		t.Fatal("a SaveSnapshot stalled behind the held flush")
	}
	close(gate) // the held flush fails, and so do its retries

	var err error
	for i := uint64(41); i <= 2000 && err == nil; i++ {
		err = s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(i)}, []*raftpb.Entry{paddedEntry(i)})
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Saves after the flush failed: err = %v, want ENOSPC", err)
	}
	_ = s.Close()
	s = openT(t, "db", Options{FS: mem}, defaultCacheLimits)
	defer func() { _ = s.Close() }()
	if sn, err := s.Snapshot(); err != nil || sn.GetMetadata().GetIndex() != 30 {
		t.Fatalf("snapshot after reopening: index %d, %v; want 30", sn.GetMetadata().GetIndex(), err)
	}
}

// checkReopened checks a store reopened after a failure: it holds entries
// first..acked as bigEntry makes them, and perhaps the failed Save's entry
// (acked+1: it may have reached the WAL). It returns the last index.
func checkReopened(t *testing.T, s *Store, first, acked uint64) uint64 {
	t.Helper()
	last, err := s.LastIndex()
	if err != nil || last < acked || last > acked+1 {
		t.Fatalf("LastIndex() after reopening = %d, %v; want %d or %d", last, err, acked, acked+1)
	}
	ents, err := s.Entries(first, acked+1, noLimitSize)
	if err != nil || uint64(len(ents)) != acked+1-first {
		t.Fatalf("Entries(%d, %d) = %d entries, %v", first, acked+1, len(ents), err)
	}
	for k, e := range ents {
		if !bytes.Equal(e.GetData(), bigEntry(uint64(k)+first).GetData()) {
			t.Fatalf("entry %d differs after reopening", uint64(k)+first)
		}
	}
	return last
}

// bigEntry is entry i at term 1 with 60 KiB of data: a few fill one of
// Pebble's memtables (256 KiB at first), 1000 fill several of the largest.
func bigEntry(i uint64) *raftpb.Entry {
	return testEntry(i, 1, fmt.Sprintf("entry %d|%s", i, bigPad))
}

var bigPad = strings.Repeat("z", 60<<10)

// saveUntilError saves bigEntry(from) .. bigEntry(to) one Save each, with
// a hard state committing each, until a Save fails. It returns the last
// index acknowledged (from-1 if none) and the error (nil if all succeeded).
func saveUntilError(s *Store, from, to uint64) (acked uint64, err error) {
	acked = from - 1
	for i := from; i <= to; i++ {
		if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(i)}, []*raftpb.Entry{bigEntry(i)}); err != nil {
			return acked, err
		}
		acked = i
	}
	return acked, nil
}
