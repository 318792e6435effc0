package transport

import (
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
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
