package walstore

import (
	"errors"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestReviewADLeaderSnapshotMetaFailure: a snapshot received from the
// leader (not matching the log, so it replaces the log with a new WAL)
// whose commit in META fails to sync is reported as failed, the store
// refuses later writes, and after a restart the store holds its earlier
// log and snapshot (DESIGN.md invariant 10). TestFsyncFailureOfOwnFiles
// covers META only for a snapshot that keeps the log. Mutation it catches
// (review AD): SaveSnapshot ignoring writeMeta's error on the replace path
// and switching to the new WAL.
func TestReviewADLeaderSnapshotMetaFailure(t *testing.T) {
	setSegmentSize(t, faultSegmentSize)
	dir := t.TempDir()
	h, on := failingSync(metaName + tmpSuffix)
	s, err := open(dir, Options{}, h)
	if err != nil {
		t.Fatal(err)
	}
	snapshotAt20(t, s)

	on.Store(true)
	leaders := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(100)), Term: new(uint64(3))}, Data: []byte("leader's state at 100")}
	if err := s.SaveSnapshot(leaders); !errors.Is(err, errInjected) {
		t.Fatalf("SaveSnapshot of the leader's snapshot with META's fsync failing: err = %v, want the injected failure", err)
	}
	on.Store(false)
	if got, err := s.Snapshot(); err != nil || got.GetMetadata().GetIndex() != 20 {
		t.Fatalf("Snapshot() = %v, %v; want the one at 20", got, err)
	}
	checkSticky(t, s)
	checkIntact(t, s, 11, 40)

	_ = s.Close()
	s = openT(t, dir)
	defer func() { _ = s.Close() }()
	checkIntact(t, s, 11, 40)
	if got, err := s.Snapshot(); err != nil || got.GetMetadata().GetIndex() != 20 {
		t.Fatalf("Snapshot() after the restart = %v, %v; want the one at 20", got, err)
	}
}
