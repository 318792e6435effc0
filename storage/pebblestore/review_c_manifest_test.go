package pebblestore

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

// TestReviewCDamagedManifest damages the MANIFEST of a store whose log went
// through several flushes, a snapshot and a compaction (so the MANIFEST
// names tables that hold acknowledged entries and the WALs they came from
// are gone): cut short at many points, or with a byte flipped at many
// points. Pebble stops reading a MANIFEST at its first bad record, so a
// lost edit could silently drop a table. Open must either fail or find
// exactly the acknowledged state (snapshot, log bounds, every entry, hard
// state); it must never open with less.
func TestReviewCDamagedManifest(t *testing.T) {
	build := func() *vfs.MemFS {
		fs := vfs.NewMem()
		s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
		saveEach(t, s, 1, 100)
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := s.SaveSnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(80)), Term: new(uint64(1))}, Data: []byte("snap80")}); err != nil {
			t.Fatal(err)
		}
		if err := s.Compact(70); err != nil {
			t.Fatal(err)
		}
		saveEach(t, s, 101, 150)
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
		saveEach(t, s, 151, 200)
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
		saveEach(t, s, 201, 210)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		return fs
	}
	manifest := func(fs *vfs.MemFS) string {
		names, err := fs.List("db")
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if strings.HasPrefix(n, "MANIFEST-") {
				return "db/" + n
			}
		}
		t.Fatalf("no MANIFEST in %v", names)
		return ""
	}
	check := func(t *testing.T, fs *vfs.MemFS, what string) {
		s, err := Open("db", Options{FS: fs})
		if err != nil {
			return // refused
		}
		defer s.Close()
		first, _ := s.FirstIndex()
		last, _ := s.LastIndex()
		hs, _, _ := s.InitialState()
		snap, err := s.Snapshot()
		if err != nil || first != 71 || last != 210 || hs.GetCommit() != 210 ||
			snap.GetMetadata().GetIndex() != 80 || string(snap.GetData()) != "snap80" {
			t.Fatalf("%s: opened with first %d last %d commit %d snapshot %d %q (%v); want 71, 210, 210, 80",
				what, first, last, hs.GetCommit(), snap.GetMetadata().GetIndex(), snap.GetData(), err)
		}
		ents, err := s.Entries(71, 211, noLimitSize)
		if err != nil || len(ents) != 140 {
			t.Fatalf("%s: Entries(71, 211) = %d entries, %v", what, len(ents), err)
		}
		for k, e := range ents {
			if !bytes.Equal(e.GetData(), paddedEntry(uint64(k)+71).GetData()) {
				t.Fatalf("%s: entry %d differs", what, k+71)
			}
		}
	}
	size := len(fileData(t, build(), manifest(build())))
	step := max(1, size/40)
	for cut := 1; cut < size; cut += step {
		fs := build()
		truncateFile(t, fs, manifest(fs), cut)
		check(t, fs, "MANIFEST cut short by "+strconv.Itoa(cut))
	}
	for at := 0; at < size; at += step {
		fs := build()
		fileData(t, fs, manifest(fs))[at] ^= 0x20
		check(t, fs, "MANIFEST byte "+strconv.Itoa(at)+" flipped")
	}
}
