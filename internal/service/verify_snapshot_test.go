package service

import (
	"bytes"
	"testing"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/raftnode"
)

var _ raftnode.SnapshotVerifier = (*Service)(nil)

// A snapshot image from the leader is checked before raftnode saves it:
// a truncated or corrupted one is refused and leaves the table alone; a
// good one is restored from the decoded copy.
func TestVerifySnapshot(t *testing.T) {
	src := fsm.New(fsm.Limits{})
	src.Apply(1, 1, &fsm.Command{Op: fsm.OpOpenSession, TTL: 10e9})
	src.Apply(2, 1, &fsm.Command{Op: fsm.OpAcquire, Session: 1, Seq: 1, Name: "a"})
	var buf bytes.Buffer
	if _, err := src.Snapshot().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	s := New(Config{})
	for _, bad := range [][]byte{good[:len(good)/2], append(bytes.Clone(good[:len(good)-1]), good[len(good)-1]^1)} {
		if err := s.VerifySnapshot(2, bad); err == nil {
			t.Fatalf("corrupt image of %d bytes verified", len(bad))
		}
	}
	if err := s.VerifySnapshot(3, good); err == nil {
		t.Fatal("image at 2 verified for index 3")
	}
	if err := s.VerifySnapshot(2, good); err != nil {
		t.Fatal(err)
	}
	if s.m.Applied() != 0 {
		t.Fatal("VerifySnapshot changed the table")
	}
	if err := s.Restore(2, good); err != nil {
		t.Fatal(err)
	}
	if s.m.Holder("a").Holder != 1 || s.verified != nil {
		t.Fatalf("restored table: %+v, verified kept: %v", s.m.Holder("a"), s.verified != nil)
	}
}
