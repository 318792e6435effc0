package walstore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/storage"
)

// The fault tests damage the files of a closed store and check what Open
// makes of it: a torn final write is repaired, anything else is refused with
// storage.ErrCorrupt naming the file.

// lastSave returns the frames the last Save of saveEach wrote to the last
// segment: the entry record and the hard state record after it.
func lastSave(t *testing.T, dir string, i uint64) (entry, state frame) {
	t.Helper()
	segs := segmentPaths(t, dir)
	fs := frames(t, segs[len(segs)-1])
	for k, f := range fs {
		if f.typ == wal.EntryType && f.index == i {
			if k+1 >= len(fs) || fs[k+1].typ != wal.StateType || k+2 != len(fs) {
				t.Fatalf("entry %d is not followed by exactly one hard state record: %+v", i, fs[k:])
			}
			return f, fs[k+1]
		}
	}
	t.Fatalf("no record of entry %d", i)
	return frame{}, frame{}
}

// TestTornFinalRecord damages the last write (entry 20 and its hard state)
// the ways a crash in the middle of it can: Open must succeed, drop only that
// write (its Save never returned), keep everything before it, and accept
// writes again.
func TestTornFinalRecord(t *testing.T) {
	setSegmentSize(t, faultSegmentSize)
	for _, c := range []struct {
		name     string
		big      bool // entry 20 spans several 512-byte sectors
		tear     func(entry, state frame) func(b []byte) []byte
		repaired bool   // wal.Repair ran and kept a .broken copy
		last     uint64 // last entry after Open; 19 unless the entry record survived
	}{
		{"cut short", false, func(e, s frame) func(b []byte) []byte {
			return func(b []byte) []byte { return b[:e.off+8+(e.end-e.off-8)/2] }
		}, true, 19},
		{"half-written last sector", true, func(e, s frame) func(b []byte) []byte {
			// The sectors after the first one of the entry never reached
			// the disk: they read as the preallocated zeros.
			return zero((e.off/512+1)*512, s.end)
		}, true, 19},
		{"hard state cut short", false, func(e, s frame) func(b []byte) []byte {
			return func(b []byte) []byte { return b[:s.off+12] }
		}, true, 20},
		{"nothing reached the disk", false, func(e, s frame) func(b []byte) []byte {
			return zero(e.off, s.end)
		}, false, 19},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openT(t, dir)
			saveEach(t, s, 1, 19)
			data := entryData(20)
			if c.big {
				data += strings.Repeat("y", 1500)
			}
			if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(20))}, []*raftpb.Entry{testEntry(20, data)}); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			e, st := lastSave(t, dir, 20)
			segs := segmentPaths(t, dir)
			modify(t, segs[len(segs)-1], c.tear(e, st))

			s, err := Open(dir, Options{})
			if err != nil {
				t.Fatalf("Open after a torn final write: %v", err)
			}
			if c.last == 20 {
				// The entry made it, its hard state did not: the write is
				// partly there, which raft allows for a write it never saw
				// acknowledged.
				if last, _ := s.LastIndex(); last != 20 {
					t.Fatalf("LastIndex() = %d, want 20", last)
				}
				if hs, _, _ := s.InitialState(); hs.GetCommit() != 19 {
					t.Fatalf("hard state %v, want commit 19", hs)
				}
			} else {
				checkIntact(t, s, 1, 19)
			}
			if _, err := os.Stat(segs[len(segs)-1] + ".broken"); (err == nil) != c.repaired {
				t.Errorf("copy of the repaired segment exists: %v, want %v", err == nil, c.repaired)
			}
			saveEach(t, s, 20, 30)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openT(t, dir)
			defer func() { _ = s.Close() }()
			checkIntact(t, s, 1, 30)
		})
	}
}

// TestCorruptRecordMidLog damages a record that later writes follow: Open
// must fail with storage.ErrCorrupt naming the segment. Several of these
// look like a torn tail to etcd's WAL alone (a zero length field ends a
// segment, a record cut short or with a zeroed sector is truncated away),
// which would silently drop every later, acknowledged record.
func TestCorruptRecordMidLog(t *testing.T) {
	setSegmentSize(t, faultSegmentSize)
	for _, c := range []struct {
		name   string
		damage func(f frame) func(b []byte) []byte
	}{
		{"flipped bit in the data", func(f frame) func(b []byte) []byte { return flip(f.end - 12) }},
		{"flipped bit in the length", func(f frame) func(b []byte) []byte { return flip(f.off + 1) }},
		{"length past the end of the file", func(f frame) func(b []byte) []byte {
			return func(b []byte) []byte { b[f.off+5] = 0x7f; return b }
		}},
		{"zeroed length", func(f frame) func(b []byte) []byte { return zero(f.off, f.off+8) }},
		{"zeroed record", func(f frame) func(b []byte) []byte { return zero(f.off+8, f.end) }},
		{"zeroed sector", func(f frame) func(b []byte) []byte { return zero(f.off/512*512, f.off/512*512+512) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openT(t, dir)
			saveEach(t, s, 1, 40)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			segs := segmentPaths(t, dir)
			seg := segs[len(segs)-1]
			modify(t, seg, c.damage(entryFrame(t, seg, 12)))

			s, err := Open(dir, Options{})
			if err == nil {
				last, _ := s.LastIndex()
				_ = s.Close()
				t.Fatalf("Open succeeded with LastIndex %d; entries 12..40 were acknowledged", last)
			}
			if !errors.Is(err, storage.ErrCorrupt) || !contains(err, seg) {
				t.Fatalf("err = %v, want storage.ErrCorrupt naming %s", err, seg)
			}
			// Refusing is stable: nothing was repaired or truncated.
			if _, err := Open(dir, Options{}); !errors.Is(err, storage.ErrCorrupt) {
				t.Fatalf("second Open: err = %v, want storage.ErrCorrupt", err)
			}
		})
	}
}

// writeSegments writes entries 1..300 to a new store in dir, closes it,
// and returns its segment files, of which there must be three or more
// (the caller has made segments small).
func writeSegments(t *testing.T, dir string) []string {
	t.Helper()
	s := openT(t, dir)
	saveEach(t, s, 1, 300)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	segs := segmentPaths(t, dir)
	if len(segs) < 3 {
		t.Fatalf("%d segments, want at least 3", len(segs))
	}
	return segs
}

// TestCorruptEarlierSegment damages a record of a segment before the last
// one, and removes a segment from the middle.
func TestCorruptEarlierSegment(t *testing.T) {
	setSegmentSize(t, 8<<10)
	for _, c := range []struct {
		name   string
		damage func(t *testing.T, segs []string) (named string)
	}{
		{"flipped bit", func(t *testing.T, segs []string) string {
			f := frames(t, segs[1])
			modify(t, segs[1], flip(f[len(f)/2].end-12))
			return segs[1]
		}},
		{"zeroed sector", func(t *testing.T, segs []string) string {
			f := frames(t, segs[1])
			modify(t, segs[1], zero(f[len(f)/2].off/512*512, f[len(f)/2].off/512*512+512))
			return segs[1]
		}},
		{"segment missing", func(t *testing.T, segs []string) string {
			if err := os.Remove(segs[1]); err != nil {
				t.Fatal(err)
			}
			return filepath.Dir(segs[1])
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			segs := writeSegments(t, dir)
			named := c.damage(t, segs)
			s, err := Open(dir, Options{})
			if err == nil {
				_ = s.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, storage.ErrCorrupt) || !contains(err, named) {
				t.Fatalf("err = %v, want storage.ErrCorrupt naming %s", err, named)
			}
		})
	}
}

// TestCorruptSnapshotFile damages the current snapshot file, and META.
func TestCorruptSnapshotFile(t *testing.T) {
	setSegmentSize(t, faultSegmentSize)
	snapPath := func(dir string) string { return filepath.Join(dir, snapFileName(1, 30)) }
	for _, c := range []struct {
		name   string
		damage func(t *testing.T, dir string) (named string)
	}{
		{"flipped bit in the data", func(t *testing.T, dir string) string {
			modify(t, snapPath(dir), func(b []byte) []byte { b[len(b)/2] ^= 1; return b })
			return snapPath(dir)
		}},
		{"flipped bit in the metadata", func(t *testing.T, dir string) string {
			modify(t, snapPath(dir), flip(14))
			return snapPath(dir)
		}},
		{"cut short", func(t *testing.T, dir string) string {
			modify(t, snapPath(dir), func(b []byte) []byte { return b[:len(b)-100] })
			return snapPath(dir)
		}},
		{"missing", func(t *testing.T, dir string) string {
			if err := os.Remove(snapPath(dir)); err != nil {
				t.Fatal(err)
			}
			return snapPath(dir)
		}},
		{"META flipped bit", func(t *testing.T, dir string) string {
			path := filepath.Join(dir, metaName)
			modify(t, path, flip(40))
			return path
		}},
		{"META cut short", func(t *testing.T, dir string) string {
			path := filepath.Join(dir, metaName)
			modify(t, path, func(b []byte) []byte { return b[:50] })
			return path
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openT(t, dir)
			saveEach(t, s, 1, 40)
			snap := &raftpb.Snapshot{
				Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(30)), Term: new(uint64(1)), ConfState: &raftpb.ConfState{Voters: []uint64{1}}},
				Data:     []byte(strings.Repeat("lock table ", 1000)),
			}
			if err := s.SaveSnapshot(snap); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			named := c.damage(t, dir)
			s, err := Open(dir, Options{})
			if err == nil {
				_ = s.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, storage.ErrCorrupt) || !contains(err, named) {
				t.Fatalf("err = %v, want storage.ErrCorrupt naming %s", err, named)
			}
		})
	}
}

// TestSnapshotDamagedWhileOpen damages the snapshot file of an open store:
// Snapshot reports it instead of handing raft bad data.
func TestSnapshotDamagedWhileOpen(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	defer func() { _ = s.Close() }()
	saveEach(t, s, 1, 5)
	if err := s.SaveSnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(5)), Term: new(uint64(1))}, Data: []byte("state")}); err != nil {
		t.Fatal(err)
	}
	modify(t, filepath.Join(dir, snapFileName(1, 5)), func(b []byte) []byte { b[len(b)-6] ^= 1; return b })
	if _, err := s.Snapshot(); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("Snapshot of a damaged file: err = %v, want storage.ErrCorrupt", err)
	}
}

// TestIdentityOfAnotherMember opens the data directory of one member as
// another: SetIdentity reports the mismatch, naming both, and changes
// nothing.
func TestIdentityOfAnotherMember(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	mine := storage.Identity{ClusterID: 0xabc, MemberID: 1}
	if err := s.SetIdentity(mine); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s = openT(t, dir)
	for _, other := range []storage.Identity{{ClusterID: 0xabc, MemberID: 2}, {ClusterID: 0xdef, MemberID: 1}} {
		err := s.SetIdentity(other)
		if !errors.Is(err, storage.ErrIdentityMismatch) ||
			!contains(err, "cluster abc member 1") || !strings.Contains(err.Error(), "asked for cluster") {
			t.Fatalf("SetIdentity(%v): err = %v, want ErrIdentityMismatch naming both identities", other, err)
		}
	}
	_ = s.Close()
	s = openT(t, dir)
	defer func() { _ = s.Close() }()
	if got, ok, err := s.Identity(); got != mine || !ok || err != nil {
		t.Fatalf("Identity() = %v, %v, %v; want %v", got, ok, err, mine)
	}
}

// TestMetaMissing refuses a directory that holds a log but no META, instead
// of starting over on it.
func TestMetaMissing(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	saveEach(t, s, 1, 3)
	_ = s.Close()
	if err := os.Remove(filepath.Join(dir, metaName)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, Options{}); !errors.Is(err, storage.ErrCorrupt) || !contains(err, metaName) {
		t.Fatalf("Open without META: err = %v, want storage.ErrCorrupt naming META", err)
	}
}

// TestLeftovers creates what writes that crashed before their commit point
// leave behind: Open removes them and keeps the committed state.
func TestLeftovers(t *testing.T) {
	setSegmentSize(t, faultSegmentSize)
	dir := t.TempDir()
	s := openT(t, dir)
	saveEach(t, s, 1, 10)
	if err := s.SaveSnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(8)), Term: new(uint64(1))}, Data: []byte("state at 8")}); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	leftovers := []string{
		snapFileName(1, 9),              // a snapshot written, META not replaced
		snapFileName(1, 10) + tmpSuffix, // a snapshot being written
		metaName + tmpSuffix,            // META being written
		walDirName(2),                   // a WAL for a leader's snapshot, META not replaced
		walDirName(3) + tmpSuffix,       // a WAL being created
	}
	for _, l := range leftovers[:3] {
		if err := os.WriteFile(filepath.Join(dir, l), []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range leftovers[3:5] {
		if err := os.MkdirAll(filepath.Join(dir, l), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s = openT(t, dir)
	defer func() { _ = s.Close() }()
	checkIntact(t, s, 1, 10)
	if snap, err := s.Snapshot(); err != nil || snap.GetMetadata().GetIndex() != 8 || string(snap.GetData()) != "state at 8" {
		t.Fatalf("Snapshot() = %v, %v; want the one at 8", snap, err)
	}
	for _, l := range leftovers {
		if _, err := os.Stat(filepath.Join(dir, l)); !os.IsNotExist(err) {
			t.Errorf("leftover %s still there (%v)", l, err)
		}
	}
}

// TestCompactReleasesSegments checks that Compact deletes the segments that
// hold only compacted entries, and that the log reads back after reopening.
func TestCompactReleasesSegments(t *testing.T) {
	setSegmentSize(t, 8<<10)
	dir := t.TempDir()
	s := openT(t, dir)
	saveEach(t, s, 1, 400)
	before := len(segmentPaths(t, dir))
	if err := s.SaveSnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(390)), Term: new(uint64(1))}, Data: []byte("state")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(350); err != nil {
		t.Fatal(err)
	}
	after := len(segmentPaths(t, dir))
	if before < 5 || after > 3 {
		t.Fatalf("%d segments before Compact, %d after; want at least 5, then at most 3", before, after)
	}
	checkIntact(t, s, 351, 400)
	_ = s.Close()
	s = openT(t, dir)
	defer func() { _ = s.Close() }()
	checkIntact(t, s, 351, 400)
}

// TestLocked refuses a directory another Store has open.
func TestLocked(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	defer func() { _ = s.Close() }()
	if s2, err := Open(dir, Options{}); err == nil {
		_ = s2.Close()
		t.Fatal("second Open of an open store succeeded")
	}
}

func TestClosed(t *testing.T) {
	s := openT(t, t.TempDir())
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
		"Save":         s.Save(nil, []*raftpb.Entry{testEntry(1, "x")}),
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
