package walstore

import (
	"os"
	"path/filepath"
	"testing"

	"go.etcd.io/etcd/server/v3/storage/wal"

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

// TestConformanceSmallSegments runs the suite with WAL segments of 16 KiB, so
// that the log spans many segments: cuts, reading across segments and
// releasing them on Compact. It runs on a RAM file system when there is one
// (this variant tests the segment logic, not the disk), without the crash
// case, which TestConformance runs.
func TestConformanceSmallSegments(t *testing.T) {
	setSegmentSize(t, 16<<10)
	base := ramDir(t)
	storagetest.Run(t, func(t *testing.T, dir string) storage.LogStore {
		s, err := Open(filepath.Join(base, dir), Options{})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	}, storagetest.SkipCrash())
}

// ramDir returns a new directory on /dev/shm, removed when the test ends, or
// "" (the real file system) when there is none.
func ramDir(t *testing.T) string {
	if fi, err := os.Stat("/dev/shm"); err != nil || !fi.IsDir() {
		return ""
	}
	dir, err := os.MkdirTemp("/dev/shm", "walstore-test-")
	if err != nil {
		return ""
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// setSegmentSize sets etcd's package-level WAL segment size for the test.
// Tests of this package do not run in parallel.
func setSegmentSize(t *testing.T, n int64) {
	old := wal.SegmentSizeBytes
	wal.SegmentSizeBytes = n
	t.Cleanup(func() { wal.SegmentSizeBytes = old })
}
