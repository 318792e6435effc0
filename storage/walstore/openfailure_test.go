package walstore

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
	"testing"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"

	"github.com/quorumlock/quorumlock/storage"
)

// TestSegmentLockedElsewhereIsNotCorrupt: etcd's wal.Open takes an
// exclusive lock on every segment it opens. A segment someone else holds
// locked (here another open file description of it, as another process
// would hold it) makes Open fail, but the WAL is intact: the error must not
// wrap storage.ErrCorrupt (an operator told "corrupt" may delete the data),
// and once the lock is gone Open finds every entry.
func TestSegmentLockedElsewhereIsNotCorrupt(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	saveEach(t, s, 1, 10)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	segs := segmentPaths(t, dir)
	held, err := fileutil.TryLockFile(segs[len(segs)-1], os.O_RDWR, fileutil.PrivateFileMode)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := Open(dir, Options{}); err == nil {
		_ = s.Close()
		t.Fatal("Open succeeded while a segment is locked by another holder")
	} else if errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("a locked segment was reported as corrupt: %v", err)
	} else if !errors.Is(err, fileutil.ErrLocked) {
		t.Fatalf("Open error does not say the segment is locked: %v", err)
	}
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir)
	defer s.Close()
	checkIntact(t, s, 1, 10)
}

// TestOpenFailureClassifies checks the rule openFailure applies to what
// wal.Open and ReadAll return: a file system error (which a test running as
// root cannot provoke with permissions) is an I/O error, anything else is
// the WAL's content and wraps storage.ErrCorrupt.
func TestOpenFailureClassifies(t *testing.T) {
	perm := &fs.PathError{Op: "open", Path: "x.wal", Err: syscall.EACCES}
	if err := openFailure("d", perm); errors.Is(err, storage.ErrCorrupt) || !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("permission error classified as %v", err)
	}
	if err := openFailure("d", errors.New("wal: crc mismatch")); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("decode error classified as %v", err)
	}
}
