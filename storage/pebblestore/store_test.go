package pebblestore

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/storage"
	"github.com/quorumlock/quorumlock/storage/storagetest"
)

func TestConformance(t *testing.T) {
	storagetest.Run(t, func(t *testing.T, dir string) storage.LogStore {
		s, err := Open(dir, Options{})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	})
}

// TestConformanceSmallCache runs the suite with caches that make most reads
// go to Pebble, and with no cache at all, on an in-memory file system (these
// variants test the cache, not the disk).
func TestConformanceSmallCache(t *testing.T) {
	for _, lim := range []cacheLimits{
		{maxEntries: 3, maxBytes: 1 << 20},
		{maxEntries: 0, maxBytes: 0},
	} {
		t.Run(fmt.Sprintf("entries=%d,bytes=%d", lim.maxEntries, lim.maxBytes), func(t *testing.T) {
			fs := vfs.NewMem()
			storagetest.Run(t, func(t *testing.T, dir string) storage.LogStore {
				return openT(t, dir, Options{FS: fs}, lim)
			}, storagetest.SkipCrash())
		})
	}
}

func openT(t testing.TB, dir string, opts Options, lim cacheLimits) *Store {
	t.Helper()
	s, err := open(dir, opts, lim)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	return s
}

func testEntry(index, term uint64, data string) *raftpb.Entry {
	return &raftpb.Entry{Index: new(index), Term: new(term), Data: []byte(data)}
}

func testEntries(lo, hi, term uint64) []*raftpb.Entry {
	var out []*raftpb.Entry
	for i := lo; i <= hi; i++ {
		out = append(out, testEntry(i, term, fmt.Sprintf("entry %d", i)))
	}
	return out
}

// failingFS returns an in-memory file system whose WAL writes and syncs fail
// with errorfs.ErrInjected while the returned toggle is on.
func failingFS(kinds ...errorfs.OpKind) (vfs.FS, *errorfs.Toggle) {
	toggle := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !strings.HasSuffix(op.Path, ".log") {
			return nil
		}
		for _, k := range kinds {
			if op.Kind == k {
				return errorfs.ErrInjected
			}
		}
		return nil
	})}
	return errorfs.Wrap(vfs.NewMem(), toggle), toggle
}

func TestWALFailureIsSticky(t *testing.T) {
	for _, c := range []struct {
		name  string
		kinds []errorfs.OpKind
	}{
		{"sync", []errorfs.OpKind{errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo}},
		{"write", []errorfs.OpKind{errorfs.OpFileWrite, errorfs.OpFileWriteAt}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs, toggle := failingFS(c.kinds...)
			s := openT(t, "db", Options{FS: fs, Logger: zap.NewNop()}, defaultCacheLimits)
			defer func() { _ = s.Close() }()
			if err := s.Save(nil, testEntries(1, 5, 1)); err != nil {
				t.Fatalf("Save before the failure: %v", err)
			}

			toggle.On()
			err := s.Save(&raftpb.HardState{Term: new(uint64(2)), Commit: new(uint64(5))}, testEntries(6, 6, 2))
			if !errors.Is(err, errorfs.ErrInjected) {
				t.Fatalf("Save with a failing WAL %s: err = %v, want errorfs.ErrInjected", c.name, err)
			}
			toggle.Off()

			// Nothing of the failed Save is visible and no later write
			// succeeds, even with the disk healthy again.
			if last, _ := s.LastIndex(); last != 5 {
				t.Fatalf("LastIndex() after the failed Save = %d, want 5", last)
			}
			if hs, _, _ := s.InitialState(); !raft.IsEmptyHardState(hs) {
				t.Fatalf("hard state after the failed Save = %v, want empty", hs)
			}
			for what, err := range map[string]error{
				"Save":         s.Save(nil, testEntries(6, 6, 2)),
				"Save (hs)":    s.Save(&raftpb.HardState{Term: new(uint64(3))}, nil),
				"SaveSnapshot": s.SaveSnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(3)), Term: new(uint64(1))}}),
				"Compact":      s.Compact(1),
				"SetIdentity":  s.SetIdentity(storage.Identity{ClusterID: 1, MemberID: 1}),
			} {
				if !errors.Is(err, errorfs.ErrInjected) {
					t.Errorf("%s after the failure: err = %v, want the sticky errorfs.ErrInjected", what, err)
				}
			}

			// Reads keep serving the durable state.
			got, err := s.Entries(1, 6, noLimitSize)
			if err != nil || len(got) != 5 {
				t.Fatalf("Entries(1, 6) after the failure = %d entries, %v; want 5", len(got), err)
			}
			// Close must not panic; its error is allowed (the WAL is broken).
			_ = s.Close()
			if err := s.Save(nil, testEntries(6, 6, 2)); !errors.Is(err, ErrClosed) {
				t.Fatalf("Save after Close: err = %v, want ErrClosed", err)
			}
		})
	}
}

const noLimitSize = ^uint64(0)

// TestPebbleFatalStopsWrites checks that a failure Pebble reports through
// Logger.Fatalf (which by default exits the process) makes the store refuse
// writes with an error that wraps the cause.
func TestPebbleFatalStopsWrites(t *testing.T) {
	s := openT(t, "db", Options{FS: vfs.NewMem()}, defaultCacheLimits)
	defer func() { _ = s.Close() }()
	if err := s.Save(nil, testEntries(1, 2, 1)); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("MANIFEST sync: input/output error")
	pebbleLogger{log: zap.NewNop().Sugar(), onFatal: s.setFatal}.Fatalf("MANIFEST sync failed: %v", cause)
	for range 2 {
		err := s.Save(nil, testEntries(3, 3, 1))
		if !errors.Is(err, cause) || !strings.Contains(err.Error(), "MANIFEST sync failed") {
			t.Fatalf("Save after a pebble fatal error: err = %v, want it to wrap %v", err, cause)
		}
	}
	if last, _ := s.LastIndex(); last != 2 {
		t.Fatalf("LastIndex() = %d, want 2", last)
	}
}

func TestClosed(t *testing.T) {
	s := openT(t, "db", Options{FS: vfs.NewMem()}, defaultCacheLimits)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, _, initErr := s.InitialState()
	_, entErr := s.Entries(1, 1, 0)
	_, termErr := s.Term(0)
	_, firstErr := s.FirstIndex()
	_, lastErr := s.LastIndex()
	_, snapErr := s.Snapshot()
	_, _, idErr := s.Identity()
	for what, err := range map[string]error{
		"InitialState": initErr, "Entries": entErr, "Term": termErr,
		"FirstIndex": firstErr, "LastIndex": lastErr, "Snapshot": snapErr, "Identity": idErr,
		"Save":         s.Save(nil, testEntries(1, 1, 1)),
		"SaveSnapshot": s.SaveSnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{}}),
		"Compact":      s.Compact(0),
		"SetIdentity":  s.SetIdentity(storage.Identity{}),
		"Close":        s.Close(),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: err = %v, want ErrClosed", what, err)
		}
	}
}

func TestOpenLockedDir(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{}, defaultCacheLimits)
	defer func() { _ = s.Close() }()
	s2, err := Open(dir, Options{})
	if err == nil {
		_ = s2.Close()
		t.Fatal("second Open of an open store succeeded")
	}
	// Say why: the bare "resource temporarily unavailable" does not.
	if !strings.Contains(err.Error(), "another store") {
		t.Fatalf("second Open: %v", err)
	}
}

// TestTailServedFromCache damages the stored copy of cached entries: Term and
// Entries of the tail must still answer from memory, while an entry outside
// the cache reports the damage.
func TestTailServedFromCache(t *testing.T) {
	s := openT(t, "db", Options{FS: vfs.NewMem()}, cacheLimits{maxEntries: 4, maxBytes: 1 << 20})
	defer func() { _ = s.Close() }()
	if err := s.Save(nil, testEntries(1, 10, 1)); err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 10; i++ {
		if err := s.db.Set(entryKey(i), []byte("garbage"), pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	if term, err := s.Term(7); err != nil || term != 1 {
		t.Fatalf("Term(7) = %d, %v; want 1 from the cache", term, err)
	}
	if ents, err := s.Entries(7, 11, noLimitSize); err != nil || len(ents) != 4 {
		t.Fatalf("Entries(7, 11) = %d entries, %v; want 4 from the cache", len(ents), err)
	}
	if _, err := s.Term(6); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("Term(6) outside the cache: err = %v, want ErrCorrupt", err)
	}
}

func TestCorruption(t *testing.T) {
	type damage struct {
		name    string
		write   func(t *testing.T, db *pebble.DB)
		wantKey string // substring of the error naming the record
	}
	set := func(key, value []byte) func(t *testing.T, db *pebble.DB) {
		return func(t *testing.T, db *pebble.DB) {
			if err := db.Set(key, value, pebble.Sync); err != nil {
				t.Fatal(err)
			}
		}
	}
	wrongIndex, _ := proto.Marshal(testEntry(4, 1, "x"))
	snapMeta := func(index, term uint64) []byte {
		v, _ := proto.Marshal(&raftpb.SnapshotMetadata{Index: new(index), Term: new(term)})
		return v
	}
	// Open reads every record, so damage anywhere fails it.
	for _, d := range []damage{
		{name: "entry garbage", write: set(entryKey(3), []byte{0xff, 0xff, 0xff}), wantKey: "entry 3"},
		{name: "entry index mismatch", write: set(entryKey(3), wrongIndex), wantKey: "entry 3"},
		{name: "missing entry", write: func(t *testing.T, db *pebble.DB) {
			if err := db.Delete(entryKey(3), pebble.Sync); err != nil {
				t.Fatal(err)
			}
		}, wantKey: "entry 3"},
		{name: "missing first entry", write: func(t *testing.T, db *pebble.DB) {
			if err := db.Delete(entryKey(1), pebble.Sync); err != nil {
				t.Fatal(err)
			}
		}, wantKey: "entry 2"},
		{name: "tail entry garbage", write: set(entryKey(10), []byte{0xff}), wantKey: "entry 10"},
		{name: "hard state", write: set(keyHardState, []byte{0xff, 0xff}), wantKey: "hard state"},
		{name: "commit past last index", write: func(t *testing.T, db *pebble.DB) {
			v, _ := proto.Marshal(&raftpb.HardState{Commit: new(uint64(11))})
			set(keyHardState, v)(t, db)
		}, wantKey: "hard state"},
		{name: "snapshot metadata", write: set(keySnapMeta, []byte{0xff}), wantKey: "snapshot metadata"},
		{name: "snapshot past last index", write: set(keySnapMeta, snapMeta(11, 1)), wantKey: "snapshot metadata"},
		{name: "snapshot term differs from the log", write: set(keySnapMeta, snapMeta(5, 7)), wantKey: "entry 5"},
		{name: "truncated state", write: set(keyTrunc, []byte{1, 2, 3}), wantKey: "truncated state"},
		{name: "truncated past the snapshot", write: set(keyTrunc, encodePair(1, 1)), wantKey: "truncated state"},
		{name: "format version", write: set(keyVersion, []byte{1}), wantKey: "format version"},
		{name: "identity", write: set(keyIdentity, []byte{1, 2}), wantKey: "identity"},
	} {
		t.Run(d.name, func(t *testing.T) {
			fs := vfs.NewMem()
			// A cache of one entry, so that entries 1..9 are read from Pebble.
			lim := cacheLimits{maxEntries: 1, maxBytes: 1 << 20}
			s := openT(t, "db", Options{FS: fs}, lim)
			if err := s.Save(nil, testEntries(1, 10, 1)); err != nil {
				t.Fatal(err)
			}
			d.write(t, s.db)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}

			s, err := open("db", Options{FS: fs}, lim)
			if err == nil {
				_ = s.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, storage.ErrCorrupt) {
				t.Fatalf("err = %v, want storage.ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), d.wantKey) || !strings.Contains(err.Error(), "db") {
				t.Fatalf("err = %q, want it to name %q and the directory", err, d.wantKey)
			}
		})
	}
}

func TestUnknownFormatVersion(t *testing.T) {
	fs := vfs.NewMem()
	s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
	if err := s.db.Set(keyVersion, encodeUint64(formatVersion+1), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s, err := Open("db", Options{FS: fs})
	if err == nil {
		_ = s.Close()
		t.Fatal("Open of a store of a newer format succeeded")
	}
	if !strings.Contains(err.Error(), "format version") {
		t.Fatalf("err = %v, want it to name the format version", err)
	}
}

// TestForeignPebbleDB refuses a Pebble database this package did not create.
func TestForeignPebbleDB(t *testing.T) {
	fs := vfs.NewMem()
	db, err := pebble.Open("db", &pebble.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("someone else's key"), []byte("v"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open("db", Options{FS: fs})
	if err == nil {
		_ = s.Close()
		t.Fatal("Open of a foreign database succeeded")
	}
	if !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("err = %v, want storage.ErrCorrupt", err)
	}
}

// TestLargeSnapshot stores a snapshot larger than Pebble's large-batch
// threshold (half the memtable), which Pebble commits as a flushable batch.
func TestLargeSnapshot(t *testing.T) {
	fs := vfs.NewMem()
	s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
	if err := s.Save(nil, testEntries(1, 10, 1)); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("lock table "), 12<<20/11)
	snap := &raftpb.Snapshot{
		Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(8)), Term: new(uint64(1)),
			ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}},
		Data: data,
	}
	if err := s.SaveSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(8); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(nil, testEntries(11, 12, 1)); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s = openT(t, "db", Options{FS: fs}, defaultCacheLimits)
	defer func() { _ = s.Close() }()
	got, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.GetData(), data) || got.GetMetadata().GetIndex() != 8 {
		t.Fatalf("Snapshot() = index %d, %d bytes; want index 8, %d bytes", got.GetMetadata().GetIndex(), len(got.GetData()), len(data))
	}
	if first, _ := s.FirstIndex(); first != 9 {
		t.Fatalf("FirstIndex() = %d, want 9", first)
	}
	if last, _ := s.LastIndex(); last != 12 {
		t.Fatalf("LastIndex() = %d, want 12", last)
	}
}

func TestTailCache(t *testing.T) {
	c := newTailCache(cacheLimits{maxEntries: 3, maxBytes: 100}, 1)
	for i := uint64(1); i <= 5; i++ {
		c.append(testEntry(i, 1, ""), 10)
	}
	if c.first != 3 || len(c.ents) != 3 || c.bytes != 30 {
		t.Fatalf("after 5 appends: first %d, %d entries, %d bytes; want 3, 3, 30", c.first, len(c.ents), c.bytes)
	}
	if c.get(2) != nil || c.get(6) != nil || c.get(4).GetIndex() != 4 {
		t.Fatal("get returned entries outside the cache or the wrong entry")
	}
	c.append(testEntry(6, 1, ""), 95) // over the byte limit: only entry 6 stays
	if c.first != 6 || len(c.ents) != 1 || c.bytes != 95 {
		t.Fatalf("after a big entry: first %d, %d entries, %d bytes; want 6, 1, 95", c.first, len(c.ents), c.bytes)
	}
	c.append(testEntry(7, 1, ""), 200) // larger than the limit on its own
	if c.first != 8 || len(c.ents) != 0 || c.bytes != 0 {
		t.Fatalf("after an oversized entry: first %d, %d entries, %d bytes; want 8, 0, 0", c.first, len(c.ents), c.bytes)
	}
	for i := uint64(8); i <= 10; i++ {
		c.append(testEntry(i, 1, ""), 10)
	}
	c.truncateFrom(9)
	if c.first != 8 || len(c.ents) != 1 || c.bytes != 10 {
		t.Fatalf("after truncateFrom(9): first %d, %d entries, %d bytes; want 8, 1, 10", c.first, len(c.ents), c.bytes)
	}
	c.truncateFrom(5)
	if c.first != 5 || len(c.ents) != 0 {
		t.Fatalf("after truncateFrom(5): first %d, %d entries; want 5, 0", c.first, len(c.ents))
	}
	for i := uint64(5); i <= 7; i++ {
		c.append(testEntry(i, 1, ""), 10)
	}
	c.dropThrough(5)
	if c.first != 6 || len(c.ents) != 2 || c.bytes != 20 {
		t.Fatalf("after dropThrough(5): first %d, %d entries, %d bytes; want 6, 2, 20", c.first, len(c.ents), c.bytes)
	}
	c.dropThrough(20)
	if c.first != 21 || len(c.ents) != 0 || c.bytes != 0 {
		t.Fatalf("after dropThrough(20): first %d, %d entries, %d bytes; want 21, 0, 0", c.first, len(c.ents), c.bytes)
	}
}
