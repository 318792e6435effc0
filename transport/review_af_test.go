package transport_test

import (
	"maps"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/transport"
)

// TestReviewAFSendDropsOwnAndUnknown: Send documents that a message for an
// unknown member or for this replica is dropped (Stats.Dropped counts an
// unknown destination), without blocking and without an Unreachable report;
// Config documents that New copies Peers and never modifies the caller's
// Config, so changing the map afterwards changes nothing.
func TestReviewAFSendDropsOwnAndUnknown(t *testing.T) {
	rec := newRecorder()
	peers := map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1:1"}
	want := maps.Clone(peers)
	cfg := transport.Config{ClusterID: 1, ID: 1, Peers: peers, Handler: rec.handle, Unreachable: rec.onUnreachable}
	tr, err := transport.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if cfg.QueueSize != 0 || cfg.MaxSnapshotBytes != 0 || cfg.Logger != nil || cfg.Dialer != nil || !maps.Equal(peers, want) {
		t.Fatalf("New modified the caller's Config: %+v", cfg)
	}
	peers[9] = "127.0.0.1:1" // a member added after New is still unknown
	msg := func(to uint64) *raftpb.Message {
		return &raftpb.Message{Type: raftpb.MessageType_MsgHeartbeat.Enum(), From: new(uint64(1)), To: new(to), Term: new(uint64(1))}
	}
	tr.Send([]*raftpb.Message{msg(1), msg(7), msg(9)})
	if got := tr.Stats().Dropped; got != 3 {
		t.Fatalf("Dropped = %d after messages to itself and to two unknown members; want 3", got)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, id := range []uint64{1, 7, 9} {
		if n := rec.unreachable[id]; n != 0 {
			t.Fatalf("Unreachable(%d) called %d times for a dropped message; want none", id, n)
		}
	}
}
