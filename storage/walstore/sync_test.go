package walstore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/storage"
)

var errInjected = errors.New("injected fsync failure")

// failingSync returns hooks whose fsync of files named with the suffix fails
// while the returned flag is set.
func failingSync(suffix string) (hooks, *atomic.Bool) {
	on := new(atomic.Bool)
	return hooks{sync: func(f *os.File) error {
		if on.Load() && strings.HasSuffix(f.Name(), suffix) {
			return errInjected
		}
		return f.Sync()
	}}, on
}

// checkSticky checks that every write returns the injected failure.
func checkSticky(t *testing.T, s *Store) {
	t.Helper()
	for what, err := range map[string]error{
		"Save":         s.Save(nil, []*raftpb.Entry{testEntry(41, entryData(41))}),
		"Save (hs)":    s.Save(&raftpb.HardState{Term: new(uint64(9))}, nil),
		"SaveSnapshot": s.SaveSnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(39)), Term: new(uint64(1))}}),
		"Compact":      s.Compact(2),
		"SetIdentity":  s.SetIdentity(storage.Identity{ClusterID: 1, MemberID: 1}),
	} {
		if !errors.Is(err, errInjected) {
			t.Errorf("%s after the failure: err = %v, want the sticky injected failure", what, err)
		}
	}
}

// TestFsyncFailureOfOwnFiles fails the fsync of the files the store writes
// itself (snapshot files, META): the write reports the failure, is not
// reported as done, the store refuses every later write, and after a
// restart the store holds what was acknowledged before.
func TestFsyncFailureOfOwnFiles(t *testing.T) {
	setSegmentSize(t, faultSegmentSize)
	snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(30)), Term: new(uint64(1))}, Data: []byte("state at 30")}
	for _, c := range []struct {
		name   string
		suffix string
		write  func(s *Store) error
		check  func(t *testing.T, s *Store) // the state of the last acknowledged write
	}{
		{"snapshot file", ".snap" + tmpSuffix, func(s *Store) error { return s.SaveSnapshot(snap) }, func(t *testing.T, s *Store) {
			if got, err := s.Snapshot(); err != nil || got.GetMetadata().GetIndex() != 20 {
				t.Fatalf("Snapshot() = %v, %v; want the one at 20", got, err)
			}
		}},
		{"META of a snapshot", metaName + tmpSuffix, func(s *Store) error { return s.SaveSnapshot(snap) }, func(t *testing.T, s *Store) {
			if got, err := s.Snapshot(); err != nil || got.GetMetadata().GetIndex() != 20 {
				t.Fatalf("Snapshot() = %v, %v; want the one at 20", got, err)
			}
		}},
		{"META of a compaction", metaName + tmpSuffix, func(s *Store) error { return s.Compact(15) }, func(t *testing.T, s *Store) {
			checkIntact(t, s, 11, 40)
		}},
		{"META of the identity", metaName + tmpSuffix, func(s *Store) error {
			return s.SetIdentity(storage.Identity{ClusterID: 7, MemberID: 7})
		}, func(t *testing.T, s *Store) {
			if _, ok, _ := s.Identity(); ok {
				t.Fatal("Identity() reports the identity whose write failed")
			}
		}},
		// The directory's fsync after renaming META fails: the rename may or
		// may not survive a crash, so the outcome is unknown. It is not
		// reported as done, and it is not taken back either.
		{"directory after META", "", func(s *Store) error { return s.Compact(15) }, func(t *testing.T, s *Store) {
			checkIntact(t, s, 11, 40)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			suffix := c.suffix
			if suffix == "" {
				suffix = filepath.Base(dir)
			}
			h, on := failingSync(suffix)
			s, err := open(dir, Options{}, h)
			if err != nil {
				t.Fatal(err)
			}
			snapshotAt20(t, s)

			on.Store(true)
			if err := c.write(s); !errors.Is(err, errInjected) {
				t.Fatalf("write with a failing fsync: err = %v, want the injected failure", err)
			}
			on.Store(false)
			c.check(t, s)
			checkSticky(t, s)
			checkIntact(t, s, 11, 40)

			_ = s.Close()
			s = openT(t, dir)
			defer func() { _ = s.Close() }()
			if c.suffix == "" {
				if first, _ := s.FirstIndex(); first != 11 && first != 16 {
					t.Fatalf("FirstIndex() = %d after the restart, want 11 or 16", first)
				}
				return
			}
			// The failed write never reached its commit point.
			checkIntact(t, s, 11, 40)
			c.check(t, s)
		})
	}
}
