package walstore

import (
	"bytes"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// FuzzDecode feeds arbitrary bytes to every decoder of stored data: each
// must return a value or an error, never panic, and what decodes must
// encode back to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add(meta{walGen: 1, hasSnap: true, snapIndex: 9, snapTerm: 2, prevIndex: 4, prevTerm: 1}.encode())
	var snap bytes.Buffer
	_ = writeSnap(&snap, &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(3)), Term: new(uint64(1))}, Data: []byte("state")})
	f.Add(snap.Bytes())
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, 80))
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := decodeMeta(b); err == nil && !bytes.Equal(m.encode(), b) {
			t.Fatalf("decodeMeta(%x) = %+v, which encodes to %x", b, m, m.encode())
		}
		if s, err := decodeSnap(b); err == nil {
			var out bytes.Buffer
			if err := writeSnap(&out, s); err != nil {
				t.Fatal(err)
			}
			if _, err := decodeSnap(out.Bytes()); err != nil {
				t.Fatalf("a decoded snapshot does not decode after encoding: %v", err)
			}
		}
		for p := 0; p < len(b); p += frameHeader {
			_, _, _ = recordAt(b, p)
		}
	})
}
