package walstore

import (
	"os"
	"path/filepath"
	"testing"
)

// TestReviewCOpenRefusesStoreItCannotWrite: Open of an existing store
// whose directory the store cannot write files in (here: the fsync of a
// file it writes there fails) fails, instead of opening a store that
// could not save a snapshot and would stop the replica at its first one.
// The store is left as it was: a later Open that can write finds every
// entry.
func TestReviewCOpenRefusesStoreItCannotWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "wal")
	s := openT(t, dir)
	saveEach(t, s, 1, 10)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	h, on := failingSync(metaName + tmpSuffix)
	on.Store(true)
	if s, err := open(dir, Options{}, h); err == nil {
		_ = s.Close()
		t.Fatal("Open succeeded on a store whose META cannot be replaced")
	} else {
		t.Logf("refused: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, metaName+tmpSuffix)); !os.IsNotExist(err) {
		t.Fatalf("the failed Open left %s behind: %v", metaName+tmpSuffix, err)
	}
	s = openT(t, dir)
	defer s.Close()
	checkIntact(t, s, 1, 10)
}
