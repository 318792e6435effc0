package pebblestore

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
)

// walSizes returns the size of every WAL file in dir.
func walSizes(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, de := range des {
		if !strings.HasSuffix(de.Name(), ".log") {
			continue
		}
		fi, err := de.Info()
		if err != nil {
			t.Fatal(err)
		}
		out[de.Name()] = fi.Size()
	}
	return out
}

// crashImage copies dir as a crash would leave it: every file as the page
// cache holds it, the store still open.
func crashImage(t *testing.T, dir string) string {
	t.Helper()
	dst := t.TempDir()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range des {
		if de.IsDir() {
			continue
		}
		in, err := os.Open(filepath.Join(dir, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dst, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			t.Fatal(err)
		}
		in.Close()
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// TestWALSizedAhead: on Linux the WAL file's size is extended ahead of the
// appends (walSizingFS), and a store whose newest WAL ends in that zeroed,
// preallocated range (a crash image, or after a WAL rotation) opens with
// every saved entry.
func TestWALSizedAhead(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{Logger: zap.NewNop()}, defaultCacheLimits)
	defer s.Close()
	hs := func(commit uint64) *raftpb.HardState {
		return &raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(1)), Commit: new(commit)}
	}
	for i := uint64(1); i <= 20; i++ {
		if err := s.Save(hs(i-1), testEntries(i, i, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if runtime.GOOS == "linux" {
		grown := false
		for name, size := range walSizes(t, dir) {
			if size >= 1<<20 {
				grown = true
			}
			t.Logf("%s: %d bytes", name, size)
		}
		if !grown {
			t.Fatalf("no WAL file was sized ahead of its records (20 small entries): %v", walSizes(t, dir))
		}
	}
	check := func(dir string, last uint64) {
		t.Helper()
		r := openT(t, dir, Options{Logger: zap.NewNop()}, defaultCacheLimits)
		defer r.Close()
		li, err := r.LastIndex()
		if err != nil || li != last {
			t.Fatalf("reopened %s: LastIndex %d, %v; want %d", dir, li, err, last)
		}
		ents, err := r.Entries(1, last+1, math.MaxUint64)
		if err != nil || len(ents) != int(last) {
			t.Fatalf("reopened: %d entries, %v; want %d", len(ents), err, last)
		}
		for i, e := range ents {
			if want := fmt.Sprintf("entry %d", i+1); e.GetIndex() != uint64(i+1) || string(e.GetData()) != want {
				t.Fatalf("reopened: entry %d is %v", i+1, e)
			}
		}
	}
	check(crashImage(t, dir), 20)

	// A rotation closes the old WAL (with its zero tail) and starts a new
	// one; a crash image then holds both.
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := uint64(21); i <= 30; i++ {
		if err := s.Save(hs(i-1), testEntries(i, i, 1)); err != nil {
			t.Fatal(err)
		}
	}
	check(crashImage(t, dir), 30)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check(dir, 30)
}
