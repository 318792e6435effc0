package quorumlock_test

import (
	"bytes"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/storage/wal"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// reviewNDirSize returns the bytes and files under dir.
func reviewNDirSize(t *testing.T, dir string) (size int64, files int) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil // removed meanwhile
		}
		size += info.Size()
		files++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return size, files
}

// reviewNProclaim proclaims n values of 4 KiB (the largest a role takes)
// through leaderships ls, in parallel.
func reviewNProclaim(t *testing.T, ls []*quorumlock.Leadership, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for k, ld := range ls {
		wg.Go(func() {
			ctx := testCtx(t, 60*time.Second)
			for i := range n / len(ls) {
				v := bytes.Repeat([]byte{byte(i + k)}, 4096)
				if err := ld.Proclaim(ctx, v); err != nil {
					t.Errorf("Proclaim: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestReviewNDataDirBounded: with a small SnapshotEntries, a long run of
// writes (4 KiB values, so that Pebble flushes and compacts, and the WAL
// rolls over segments of 1 MiB) leaves each replica's data directory
// about as large as after the first part of the run: old snapshots, log
// segments and tables are removed, for both backends.
func TestReviewNDataDirBounded(t *testing.T) {
	t.Parallel()
	old := wal.SegmentSizeBytes
	wal.SegmentSizeBytes = 1 << 20
	t.Cleanup(func() { wal.SegmentSizeBytes = old })
	for _, backend := range []quorumlock.LogBackend{quorumlock.LogPebble, quorumlock.LogWAL} {
		t.Run(string(backend), func(t *testing.T) {
			c := testcluster.New(t, testcluster.Options{Size: 3, Configure: func(cfg *quorumlock.Config) {
				cfg.SnapshotEntries = 200
				cfg.LogBackend = backend
			}})
			lead := c.WaitLeader(10 * time.Second)
			var ls []*quorumlock.Leadership
			for i := range 16 {
				ld, err := c.Node(lead).Elect(testCtx(t, 10*time.Second), fmt.Sprint("disk/", i), nil)
				if err != nil {
					t.Fatal(err)
				}
				ls = append(ls, ld)
			}
			measure := func() (total int64, files int) {
				for _, id := range c.IDs() {
					s, f := reviewNDirSize(t, c.Config(id).DataDir)
					total += s
					files += f
				}
				return total, files
			}
			reviewNProclaim(t, ls, 3000) // 12 MiB of values
			s1, f1 := measure()
			reviewNProclaim(t, ls, 9000) // 36 MiB more
			s2, f2 := measure()
			t.Logf("%s: after 3,000 proclaims: %d bytes in %d files; after 12,000: %d bytes in %d files", backend, s1, f1, s2, f2)
			if s2 > 2*s1+(16<<20) || f2 > 2*f1+30 {
				t.Errorf("data directories grew from %d bytes in %d files to %d bytes in %d files", s1, f1, s2, f2)
			}
		})
	}
}
