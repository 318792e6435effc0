package walstore

import (
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestCommitOnlySaveIsDeferred: a Save that only moves the commit index
// writes nothing to the WAL; InitialState reports it meanwhile; the next
// Save writes it as its hard state record, and so does Close (a clean stop
// keeps the commit index reached).
func TestCommitOnlySaveIsDeferred(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	saveEach(t, s, 1, 10)
	commitOnly := func(c uint64) {
		t.Helper()
		if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(c)}, nil); err != nil {
			t.Fatal(err)
		}
		if hs, _, err := s.InitialState(); err != nil || hs.GetCommit() != c {
			t.Fatalf("InitialState after a commit-only Save of %d: %v, %v", c, hs, err)
		}
	}
	records := func() int {
		t.Helper()
		segs := segmentPaths(t, dir)
		return len(frames(t, segs[len(segs)-1]))
	}
	reopen := func() uint64 {
		t.Helper()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = openT(t, dir)
		hs, _, err := s.InitialState()
		if err != nil {
			t.Fatal(err)
		}
		return hs.GetCommit()
	}

	for i := uint64(11); i <= 12; i++ {
		if err := s.Save(nil, []*raftpb.Entry{testEntry(i, entryData(i))}); err != nil {
			t.Fatal(err)
		}
	}
	n := records()
	commitOnly(12)
	if got := records(); got != n {
		t.Fatalf("a commit-only Save wrote %d records; want none", got-n)
	}
	if err := s.Save(nil, []*raftpb.Entry{testEntry(13, entryData(13))}); err != nil {
		t.Fatal(err)
	}
	if got := records(); got != n+2 {
		t.Fatalf("the Save after a commit-only one wrote %d records; want 2 (the hard state and entry 13)", got-n)
	}
	if c := reopen(); c != 12 {
		t.Fatalf("commit %d after reopening; want 12, deferred and written with entry 13", c)
	}
	commitOnly(13)
	if c := reopen(); c != 13 {
		t.Fatalf("commit %d after Close and reopening; want 13, written by Close", c)
	}
	s.Close()
}

// TestSnapshotAfterCommitOnlySave: a snapshot this replica took at an index
// only a deferred commit-only Save covers writes that hard state with it:
// reopened, the commit index is not below the snapshot (raft refuses to
// start from a snapshot above its commit index).
func TestSnapshotAfterCommitOnlySave(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir)
	for i := uint64(1); i <= 10; i++ {
		if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(min(i, 5))}, []*raftpb.Entry{testEntry(i, entryData(i))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(uint64(10))}, nil); err != nil {
		t.Fatal(err)
	}
	snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(10)), Term: new(uint64(1)), ConfState: &raftpb.ConfState{Voters: []uint64{1}}}, Data: []byte("state at 10")}
	if err := s.SaveSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir)
	defer s.Close()
	if hs, _, err := s.InitialState(); err != nil || hs.GetCommit() < 10 {
		t.Fatalf("InitialState after reopening: %v, %v; want commit >= the snapshot's index 10", hs, err)
	}
}
