package pebblestore

import (
	"errors"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

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
