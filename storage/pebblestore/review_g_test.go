package pebblestore

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/storage"
)

// TestReviewGMissingFileIsCorrupt removes, in turn, each file of a store
// that its metadata still needs (the table holding the flushed entries, the
// current MANIFEST, the format-version marker) and reopens it: Open must
// fail with an error wrapping storage.ErrCorrupt that names what is gone,
// as it does for a damaged file. Pebble reports the first two as "file does
// not exist" and the third as ErrDBNotPristine, neither of them one of its
// corruption errors, and Open returned them unmarked, so a caller checking
// errors.Is(err, storage.ErrCorrupt) took the damaged store for an I/O
// problem.
func TestReviewGMissingFileIsCorrupt(t *testing.T) {
	for _, c := range []struct {
		name   string
		prefix string // the removed file is the newest one with this prefix (or suffix, below)
		suffix string
		want   string // the error must contain this
	}{
		{"table", "", ".sst", ""}, // want: the table's number, filled in below
		{"manifest", "MANIFEST-", "", "MANIFEST-"},
		{"format marker", "marker.format-version.", "", "format-version marker"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := vfs.NewMem()
			s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
			saveEach(t, s, 1, 20)
			if err := s.db.Flush(); err != nil {
				t.Fatal(err)
			}
			saveEach(t, s, 21, 30)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			var victim string
			if c.suffix != "" {
				victim = newestFile(t, fs, "db", c.suffix)
			} else {
				names, err := fs.List("db")
				if err != nil {
					t.Fatal(err)
				}
				for _, n := range names {
					if strings.HasPrefix(n, c.prefix) && n > victim {
						victim = n
					}
				}
				if victim == "" {
					t.Fatalf("no %s* file in %v", c.prefix, names)
				}
			}
			want := c.want
			if want == "" {
				want = strings.TrimSuffix(victim, c.suffix)
			}
			if err := fs.Remove("db/" + victim); err != nil {
				t.Fatal(err)
			}
			s, err := Open("db", Options{FS: fs})
			if err == nil {
				_ = s.Close()
				t.Fatalf("Open succeeded without %s", victim)
			}
			if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), want) {
				t.Fatalf("Open without %s: %v; want storage.ErrCorrupt naming %q", victim, err, want)
			}
			t.Logf("Open without %s: %v", victim, err)
		})
	}
}

// TestReviewGDamagedManifestRecordInTheMiddle damages a version edit in
// the middle of the current MANIFEST (one recording a flush, with later
// ones after it) and reopens the store: Open must fail with
// storage.ErrCorrupt naming the MANIFEST. Pebble stops reading its
// MANIFEST at the first record that fails its checks, as at a torn final
// write, and forgets the edits from there on; here it then failed on a
// table it no longer knew, an error naming that table (and, before
// missingPiece, not storage.ErrCorrupt), not the damaged file.
func TestReviewGDamagedManifestRecordInTheMiddle(t *testing.T) {
	fs := vfs.NewMem()
	s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
	for k := uint64(0); k < 4; k++ {
		saveEach(t, s, 10*k+1, 10*k+10)
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var manifest string
	names, err := fs.List("db")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, "marker.manifest.") {
			_, manifest, _ = strings.Cut(strings.TrimPrefix(n, "marker.manifest."), ".")
		}
	}
	b := fileData(t, fs, "db/"+manifest)
	// Walk the records (7-byte legacy chunk headers, one chunk each here)
	// and damage the payload of the second to last.
	var starts []int
	for p := 0; p+7 <= len(b) && b[p+6] != 0; p += 7 + int(b[p+4]) | int(b[p+5])<<8 {
		starts = append(starts, p)
	}
	if len(starts) < 3 {
		t.Fatalf("%s holds %d records, want at least 3", manifest, len(starts))
	}
	b[starts[len(starts)-2]+8] ^= 0x10

	s, err = Open("db", Options{FS: fs})
	if err == nil {
		last, _ := s.LastIndex()
		_ = s.Close()
		t.Fatalf("Open succeeded with a damaged record in the middle of %s (last index %d, 40 saved)", manifest, last)
	}
	if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), manifest) {
		t.Fatalf("Open: %v; want storage.ErrCorrupt naming %s", err, manifest)
	}
	t.Logf("Open: %v", err)
}

// TestReviewGDamagedTableAtOpen flips a byte at a quarter, half and three
// quarters of each table of a store on disk (and leaves entries in the
// WAL, so that Open flushes them and has L0 tables to compact) and reopens a fresh copy, several times
// each: Open must fail with storage.ErrCorrupt naming the table, or, if
// the damaged block is one Open does not read, succeed with every entry.
// Before, Pebble's compaction met the damaged table while pebble.Open
// ran; the store fenced its files (Pebble's DataCorruption went to
// Logger.Fatalf) or gave up on pebble.Open (BackgroundError), pebble.Open
// then failed while the compaction still ran, and the process died in
// Pebble (integer divide by zero in its released file cache, or a nil
// pointer closing the directory lock twice); when it did not, the error
// did not wrap storage.ErrCorrupt.
func TestReviewGDamagedTableAtOpen(t *testing.T) {
	base := filepath.Join(t.TempDir(), "db")
	s := openT(t, base, Options{}, defaultCacheLimits)
	for k := uint64(0); k < 4; k++ {
		saveEach(t, s, 10*k+1, 10*k+10)
		if k == 2 {
			// A snapshot and a compaction: the range deletion gives
			// Pebble a table to compact away.
			snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(30)), Term: new(uint64(1))}, Data: []byte("snapshot")}
			if err := s.SaveSnapshot(snap); err != nil {
				t.Fatal(err)
			}
			if err := s.Compact(20); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	saveEach(t, s, 41, 50) // left in the WAL: Open flushes it, then compacts
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	tables, err := filepath.Glob(filepath.Join(base, "*.sst"))
	if err != nil || len(tables) == 0 {
		t.Fatalf("tables: %v, %v", tables, err)
	}
	opened, refused := 0, 0
	defer func() { t.Logf("refused %d times, opened intact %d times", refused, opened) }()
	for _, table := range tables {
		for _, frac := range []float64{0.25, 0.5, 0.75} {
			for range 8 {
				dir := filepath.Join(t.TempDir(), "db")
				if err := os.CopyFS(dir, os.DirFS(base)); err != nil {
					t.Fatal(err)
				}
				p := filepath.Join(dir, filepath.Base(table))
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				b[int(float64(len(b))*frac)] ^= 0x10
				if err := os.WriteFile(p, b, 0o644); err != nil {
					t.Fatal(err)
				}
				s, err := Open(dir, Options{})
				if err == nil {
					first, _ := s.FirstIndex()
					last, _ := s.LastIndex()
					ents, err := s.Entries(21, 51, noLimitSize)
					hs, _, _ := s.InitialState()
					_ = s.Close()
					if first != 21 || last != 50 || err != nil || len(ents) != 30 || hs.GetCommit() != 50 {
						t.Fatalf("Open with %s damaged at %.2f succeeded with log [%d, %d] (%d entries read, %v), commit %d; want [21, 50], commit 50",
							filepath.Base(table), frac, first, last, len(ents), err, hs.GetCommit())
					}
					for k, e := range ents {
						if want := paddedEntry(uint64(21 + k)); !bytes.Equal(e.GetData(), want.GetData()) {
							t.Fatalf("entry %d = %q after opening with a damaged table", 21+k, e.GetData())
						}
					}
					opened++
					continue
				}
				refused++
				num := strings.TrimSuffix(filepath.Base(table), ".sst")
				if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), num) {
					t.Fatalf("Open with %s damaged at %.2f: %v; want storage.ErrCorrupt naming table %s", filepath.Base(table), frac, err, num)
				}
			}
		}
	}
}
