package pebblestore

import (
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// FuzzDecode feeds arbitrary bytes to every decoder of stored records: each
// must return a value or an error, never panic.
func FuzzDecode(f *testing.F) {
	good, _ := proto.Marshal(&raftpb.Entry{Index: new(uint64(7)), Term: new(uint64(2)), Data: []byte("x")})
	f.Add(uint64(7), good)
	f.Add(uint64(0), []byte{})
	f.Add(uint64(1), encodePair(1, 2))
	f.Add(uint64(1), []byte{0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, index uint64, v []byte) {
		if e, err := decodeEntry(index, v); err == nil && e.GetIndex() != index {
			t.Fatalf("decodeEntry(%d) returned index %d", index, e.GetIndex())
		}
		_, _, _ = decodePair(v)
		_, _ = decodeUint64(v)
		_, _ = decodeIdentity(v)
		_, _ = parseEntryKey(v)
		_ = keyName(v)
		// The WAL and MANIFEST checks parse chunks of any content.
		if p := firstBadChunk(v, walChunkAt(uint32(index)), walSyncHeader); p >= len(v) {
			t.Fatalf("firstBadChunk (WAL) returned %d past the end of %d bytes", p, len(v))
		}
		if p := firstBadChunk(v, manifestChunkAt, walLegacyHeaderSize); p >= len(v) {
			t.Fatalf("firstBadChunk (MANIFEST) returned %d past the end of %d bytes", p, len(v))
		}
		for p := 0; p < len(v); p++ {
			_, _ = validChunkAt(v, p, uint32(index))
			_, _, _ = manifestChunkAt(v, p)
		}
	})
}
