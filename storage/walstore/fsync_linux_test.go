package walstore

import (
	"errors"
	"os"
	"syscall"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestWALFsyncFailure makes the fdatasync that etcd's WAL issues in wal.Save
// fail for real. The WAL writes through an *os.File of its own and offers no
// file system hook (only gofail failpoints, compiled in by etcd's own failpoint
// build), so the test swaps the file descriptor of the last segment for one
// of /dev/null with dup3: writes to it succeed and fdatasync fails with
// EINVAL, as it would on a device that lost the write.
//
// Save must return the error (errors.Is finds syscall.EINVAL), report
// nothing of the write as saved, and refuse every later write; after a
// restart the store holds exactly what was acknowledged before.
func TestWALFsyncFailure(t *testing.T) {
	setSegmentSize(t, faultSegmentSize)
	for _, c := range []struct {
		name  string
		write func(s *Store) error
	}{
		{"Save", func(s *Store) error {
			return s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(41))}, []*raftpb.Entry{testEntry(41, entryData(41))})
		}},
		{"Save of a new term only", func(s *Store) error {
			return s.Save(&raftpb.HardState{Term: new(uint64(2)), Commit: new(uint64(40))}, nil)
		}},
		{"SaveSnapshot", func(s *Store) error {
			return s.SaveSnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(35)), Term: new(uint64(1))}, Data: []byte("state")})
		}},
		{"Compact", func(s *Store) error { return s.Compact(15) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			s := openT(t, dir)
			snapshotAt20(t, s)
			segs := segmentPaths(t, dir)
			breakFsync(t, segs[len(segs)-1])

			err := c.write(s)
			if !errors.Is(err, syscall.EINVAL) {
				t.Fatalf("write with a failing fdatasync: err = %v, want one wrapping EINVAL", err)
			}
			checkIntact(t, s, 11, 40)
			if snap, err := s.Snapshot(); err != nil || snap.GetMetadata().GetIndex() != 20 {
				t.Fatalf("Snapshot() = %v, %v; want the one at 20", snap, err)
			}
			for what, err := range map[string]error{
				"Save":         s.Save(nil, []*raftpb.Entry{testEntry(41, entryData(41))}),
				"SaveSnapshot": s.SaveSnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(39)), Term: new(uint64(1))}}),
				"Compact":      s.Compact(12),
			} {
				if !errors.Is(err, syscall.EINVAL) {
					t.Errorf("%s after the failure: err = %v, want the sticky EINVAL", what, err)
				}
			}
			// Closing syncs the WAL again, which fails; the directory lock
			// is released anyway.
			_ = s.Close()

			s = openT(t, dir)
			defer func() { _ = s.Close() }()
			checkIntact(t, s, 11, 40)
			if snap, err := s.Snapshot(); err != nil || snap.GetMetadata().GetIndex() != 20 {
				t.Fatalf("Snapshot() after the restart = %v, %v; want the one at 20", snap, err)
			}
		})
	}
}

// breakFsync points the process's file descriptor of path at /dev/null.
func breakFsync(t *testing.T, path string) {
	t.Helper()
	target := openFD(t, path)
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = null.Close() }()
	if err := syscall.Dup3(int(null.Fd()), target, syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	// fdatasync on /dev/null must fail, or the test proves nothing.
	if err := syscall.Fdatasync(int(null.Fd())); !errors.Is(err, syscall.EINVAL) {
		t.Skipf("fdatasync on %s: %v, want EINVAL", os.DevNull, err)
	}
}
