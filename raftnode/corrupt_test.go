package raftnode

import (
	"errors"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// A log whose hard state commits past its last entry (damaged storage) is
// refused with an error at New, not a panic.
func TestNewRefusesInconsistentLog(t *testing.T) {
	st := newMemStore()
	if err := st.Append([]*raftpb.Entry{{Index: new(uint64(1)), Term: new(uint64(1))}}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetHardState(&raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(0)), Commit: new(uint64(30))}); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{ID: 1, Peers: []uint64{1}, Storage: st, Transport: nopTransport{}, StateMachine: &recSM{}})
	if !errors.Is(err, ErrCorruptState) {
		t.Fatalf("New on an inconsistent log: %v, want ErrCorruptState", err)
	}
}

type nopTransport struct{}

func (nopTransport) Send([]*raftpb.Message) {}
