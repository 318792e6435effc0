package raftnode

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/clock"
)

// snapFailStore is a memStore whose SaveSnapshot fails with err (a failed
// fsync of the snapshot or of the metadata naming it); Save works.
type snapFailStore struct {
	*memStore
	err error
}

func (s *snapFailStore) SaveSnapshot(*raftpb.Snapshot) error { return s.err }

// TestReviewADOwnSnapshotSaveErrorStopsNode (invariant 10): a failed save
// of a snapshot the node took itself stops the node with that error, as a
// failed Save does; it is never skipped and retried at the next snapshot
// (an fsync error is not retried).
func TestReviewADOwnSnapshotSaveErrorStopsNode(t *testing.T) {
	injected := errors.New("injected snapshot fsync failure")
	c := newClusterWith(t, 1, func(cfg *Config) {
		cfg.SnapshotEntries = 2
		cfg.CatchUpEntries = 1
		cfg.Storage = &snapFailStore{memStore: cfg.Storage.(*memStore), err: injected}
	})
	lead := c.waitLeader()
	n := c.nodes[lead]
	// A few entries make a snapshot due; its save fails. Proposals after
	// the stop fail with ErrStopped, which is fine.
	for i := range 8 {
		if err := n.Propose(testCtx(t), fmt.Appendf(nil, "e%d", i)); err != nil {
			if !errors.Is(err, ErrStopped) {
				t.Fatalf("Propose: %v", err)
			}
			break
		}
	}
	waitDone(t, "the node to stop after its snapshot save failed", n.Done())
	if err := n.Err(); !errors.Is(err, injected) {
		t.Fatalf("Err() = %v, want it to wrap %v", err, injected)
	}
	if calls := c.fatals[lead].calls(); len(calls) != 1 || !errors.Is(calls[0], injected) {
		t.Fatalf("OnFatal calls = %v, want exactly one wrapping %v", calls, injected)
	}
}

// TestReviewADReceivedSnapshotSaveErrorStopsNode (invariant 10): a follower
// whose save of the leader's snapshot fails stops with that error and does
// not restore its state machine from a snapshot that is not durable (it
// would apply a state its storage does not hold, and acknowledge it).
func TestReviewADReceivedSnapshotSaveErrorStopsNode(t *testing.T) {
	injected := errors.New("injected snapshot fsync failure")
	st := &snapFailStore{memStore: newMemStore(), err: injected}
	sm := &recSM{}
	var sent []*raftpb.Message
	tr := recordingTransport(func(msgs []*raftpb.Message) { sent = append(sent, msgs...) })
	n, err := New(Config{ID: 2, Peers: []uint64{1, 2, 3}, Storage: st, Transport: tr,
		StateMachine: sm, Clock: clock.NewManual(time.Unix(1_000_000, 0)), TickInterval: testTick, ElectionTicks: electionTicks})
	if err != nil {
		t.Fatal(err)
	}
	n.Start()
	defer n.Stop()
	n.Step(&raftpb.Message{
		Type: raftpb.MsgSnap.Enum(), From: new(uint64(1)), To: new(uint64(2)), Term: new(uint64(2)),
		Snapshot: &raftpb.Snapshot{Data: []byte("image"),
			Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(100)), Term: new(uint64(2)), ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}}},
	})
	waitDone(t, "the node to stop after saving the leader's snapshot failed", n.Done())
	if err := n.Err(); !errors.Is(err, injected) {
		t.Fatalf("Err() = %v, want it to wrap %v", err, injected)
	}
	for _, e := range sm.eventLog() {
		if e.kind == "restore" {
			t.Fatalf("the state machine restored the snapshot whose save failed: %+v", e)
		}
	}
	for _, m := range sent {
		if m.GetType() == raftpb.MessageType_MsgAppResp && !m.GetReject() && m.GetIndex() >= 100 {
			t.Fatalf("the follower acknowledged the snapshot whose save failed: %v", m)
		}
	}
}

// recordingTransport hands every sent message to f (on the node's
// goroutine; read only after the node stopped).
type recordingTransport func([]*raftpb.Message)

func (f recordingTransport) Send(msgs []*raftpb.Message) { f(msgs) }
