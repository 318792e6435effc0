package walstore

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestReviewADWALFsyncFailureStaysStickyAfterTheDiskRecovers: after the
// WAL's fdatasync failed once, Save refuses every later write even when the
// device works again (DESIGN.md invariant 10: an fsync error is never
// retried; after it the kernel may have dropped the dirty pages, so a later
// successful fsync proves nothing). TestWALFsyncFailure leaves the file
// descriptor broken, so a later Save fails whether or not the failure is
// sticky; here the descriptor is restored first. Mutation it catches
// (review AD): Save returning the WAL's error without recording it
// (s.fail).
func TestReviewADWALFsyncFailureStaysStickyAfterTheDiskRecovers(t *testing.T) {
	setSegmentSize(t, faultSegmentSize)
	dir := t.TempDir()
	s := openT(t, dir)
	defer func() { _ = s.Close() }()
	saveEach(t, s, 1, 40)
	segs := segmentPaths(t, dir)
	fd := openFD(t, segs[len(segs)-1])
	saved, err := syscall.Dup(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Close(saved) }()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = null.Close() }()
	if err := syscall.Fdatasync(int(null.Fd())); !errors.Is(err, syscall.EINVAL) {
		t.Skipf("fdatasync on %s: %v, want EINVAL", os.DevNull, err)
	}
	if err := syscall.Dup3(int(null.Fd()), fd, syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	err = s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(41))}, []*raftpb.Entry{testEntry(41, entryData(41))})
	if !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("Save with a failing fdatasync: err = %v, want one wrapping EINVAL", err)
	}
	// The device works again: the segment's descriptor is the real file.
	if err := syscall.Dup3(saved, fd, syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	err = s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(42))}, []*raftpb.Entry{testEntry(42, entryData(42))})
	if !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("Save after a failed fdatasync, the device working again: err = %v, want the sticky EINVAL", err)
	}
}

// openFD returns the process's one file descriptor open on path.
func openFD(t *testing.T, path string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	target := -1
	for _, de := range fds {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", de.Name()))
		if err != nil || link != path {
			continue
		}
		if target >= 0 {
			t.Fatalf("%s is open more than once", path)
		}
		if target, err = strconv.Atoi(de.Name()); err != nil {
			t.Fatal(err)
		}
	}
	if target < 0 {
		t.Fatalf("%s is not open", path)
	}
	return target
}
