package quorumlock_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
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
