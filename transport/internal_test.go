package transport

import (
	"bytes"
	"hash/crc32"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

func TestBackoff(t *testing.T) {
	var b backoff
	want := []time.Duration{50, 100, 200, 400, 800, 1600, 2000, 2000}
	for round := range 2 {
		for i, d := range want {
			d *= time.Millisecond
			if got := b.next(); got < d/2 || got >= d {
				t.Fatalf("round %d, wait %d: %v, want in [%v, %v)", round, i, got, d/2, d)
			}
		}
		b.reset()
	}
}

// FuzzDecode checks that no input makes decode panic and that whatever it
// accepts is addressed as the stream says.
func FuzzDecode(f *testing.F) {
	good, err := proto.Marshal(&raftpb.Message{
		Type: raftpb.MsgApp.Enum(), From: proto.Uint64(2), To: proto.Uint64(1), Term: proto.Uint64(3),
		Entries: []*raftpb.Entry{{Index: proto.Uint64(4), Data: []byte("x")}},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff})
	f.Add(good[:len(good)-1])
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decode(b, 2, 1)
		if err != nil {
			return
		}
		if m.GetFrom() != 2 || m.GetTo() != 1 {
			t.Fatalf("decode accepted %v on the stream from 2 to 1", m)
		}
	})
}

// withoutSnapshotData leaves the message alone and keeps everything but the
// data.
func TestWithoutSnapshotData(t *testing.T) {
	m := &raftpb.Message{
		Type: raftpb.MsgSnap.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(3),
		Context: []byte("ctx"),
		Snapshot: &raftpb.Snapshot{Data: []byte("state"), Metadata: &raftpb.SnapshotMetadata{
			Index: proto.Uint64(9), Term: proto.Uint64(3), ConfState: &raftpb.ConfState{Voters: []uint64{1, 2}}}},
	}
	want := proto.Clone(m).(*raftpb.Message)
	want.Snapshot.Data = nil
	h := withoutSnapshotData(m)
	if !proto.Equal(h, want) {
		t.Fatalf("header %v, want %v", h, want)
	}
	if string(m.GetSnapshot().GetData()) != "state" {
		t.Fatal("the original message lost its data")
	}
}

// FuzzReassembly feeds a header and data split at fuzzed points to the
// reassembly of an inbound snapshot: nothing panics, and whatever it accepts
// is a MsgSnap of the stream with exactly the announced data.
func FuzzReassembly(f *testing.F) {
	header, err := proto.Marshal(&raftpb.Message{
		Type: raftpb.MsgSnap.Enum(), From: proto.Uint64(2), To: proto.Uint64(1), Term: proto.Uint64(3),
		Snapshot: &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(4), Term: proto.Uint64(3)}},
	})
	if err != nil {
		f.Fatal(err)
	}
	data := []byte("the state of the lock table")
	sum := crc32.Checksum(data, castagnoli)
	f.Add(header, uint64(len(data)), sum, data, []byte{5, 10})
	f.Add(header, uint64(len(data)), sum^1, data, []byte{})
	f.Add(header, uint64(len(data)+1), sum, data, []byte{255})
	f.Add(header, uint64(0), uint32(0), []byte{}, []byte{})
	f.Add(header[:len(header)-1], uint64(len(data)), sum, data, []byte{1})
	f.Add([]byte{}, uint64(1)<<40, sum, data, []byte{1})
	f.Fuzz(func(t *testing.T, header []byte, total uint64, sum uint32, data, cuts []byte) {
		const max = 1 << 16
		r, err := newReassembly(&lockpb.SnapshotChunk{Hello: &lockpb.Hello{}, Message: header, Total: total, Crc32C: sum}, 2, 1, max)
		if err != nil {
			return
		}
		if total > max || uint64(cap(r.buf)) != total {
			t.Fatalf("accepted total %d with limit %d (buffer of %d)", total, max, cap(r.buf))
		}
		off := 0
		for i := 0; off < len(data); i++ {
			n := len(data) - off
			if i < len(cuts) {
				n = min(n, int(cuts[i]))
			}
			if err := r.add(&lockpb.SnapshotChunk{Offset: uint64(off), Data: data[off : off+n]}); err != nil {
				return
			}
			off += n
		}
		m, err := r.finish()
		if err != nil {
			return
		}
		got := m.GetSnapshot().GetData()
		if m.GetType() != raftpb.MsgSnap || m.GetFrom() != 2 || m.GetTo() != 1 {
			t.Fatalf("accepted %v from %d to %d on the stream from 2 to 1", m.GetType(), m.GetFrom(), m.GetTo())
		}
		if uint64(len(got)) != total || !bytes.Equal(got, data) || crc32.Checksum(got, castagnoli) != sum {
			t.Fatalf("accepted %d bytes, announced %d with CRC %#x", len(got), total, sum)
		}
	})
}
