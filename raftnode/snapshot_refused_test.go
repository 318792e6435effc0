package raftnode

import (
	"errors"
	"io"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/clock"
)

// refusingSM is a recSM whose Restore refuses images that are not "GOOD",
// as the lock table refuses a corrupt or unknown-version image.
type refusingSM struct{ recSM }

func (s *refusingSM) Restore(index uint64, data []byte) error {
	if string(data) != "GOOD" {
		return errors.New("corrupt image")
	}
	return s.recSM.Restore(index, data)
}

func (s *refusingSM) VerifySnapshot(index uint64, data []byte) error {
	if string(data) != "GOOD" {
		return errors.New("corrupt image")
	}
	return nil
}

func (s *refusingSM) Snapshot() (uint64, func(io.Writer) error) { return s.recSM.Snapshot() }

// A snapshot from the leader whose image the state machine refuses must be
// refused as a whole: not made durable (which replaces the follower's log
// and leaves a data directory that can never start again), not applied.
func TestRefusedSnapshotIsNotPersisted(t *testing.T) {
	st := newMemStore()
	sm := &refusingSM{}
	cfg := Config{ID: 2, Peers: []uint64{1, 2, 3}, Storage: st, Transport: nopTransport{},
		StateMachine: sm, Clock: clock.NewManual(time.Unix(1_000_000, 0)), TickInterval: testTick, ElectionTicks: electionTicks}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.Start()
	defer n.Stop()
	// The leader of term 2 appends two entries and commits them.
	n.Step(&raftpb.Message{
		Type: raftpb.MsgApp.Enum(), From: new(uint64(1)), To: new(uint64(2)), Term: new(uint64(2)),
		Index: new(uint64(3)), LogTerm: new(uint64(1)), Commit: new(uint64(5)),
		Entries: []*raftpb.Entry{{Index: new(uint64(4)), Term: new(uint64(2)), Data: []byte("a")}, {Index: new(uint64(5)), Term: new(uint64(2)), Data: []byte("b")}},
	})
	deadline := time.Now().Add(5 * time.Second)
	for st.lastIndex() < 5 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	lastBefore := st.lastIndex()
	voters := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	n.Step(&raftpb.Message{
		Type: raftpb.MsgSnap.Enum(), From: new(uint64(1)), To: new(uint64(2)), Term: new(uint64(2)),
		Snapshot: &raftpb.Snapshot{Data: []byte("BAD image"),
			Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(100)), Term: new(uint64(2)), ConfState: voters}},
	})
	select {
	case <-n.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("node neither refused nor applied the snapshot")
	}
	t.Logf("node stopped: %v", n.Err())
	snap, _ := st.Snapshot()
	if idx := snap.GetMetadata().GetIndex(); idx != 0 {
		first, _ := st.FirstIndex()
		t.Errorf("refused snapshot at %d was made durable: first index %d, last %d (was %d); the log is gone", idx, first, st.lastIndex(), lastBefore)
	}
	// The data directory must still start.
	if _, err := New(Config{ID: 2, Peers: []uint64{1, 2, 3}, Storage: st, Transport: nopTransport{},
		StateMachine: &refusingSM{}, Clock: clock.NewManual(time.Unix(1_000_000, 0)), TickInterval: testTick, ElectionTicks: electionTicks}); err != nil {
		t.Errorf("replica cannot restart on its own storage: %v", err)
	}
}
