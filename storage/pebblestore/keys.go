package pebblestore

import (
	"encoding/binary"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/storage"
)

// Key layout. Every key starts with a one-byte prefix so that the record kinds
// never interleave; log entries sort by index because the index is big-endian.
//
//	0x00                  format version, uint64 big-endian
//	0x01 + index (8 B BE) log entry, a marshalled raftpb.Entry
//	0x02                  hard state, a marshalled raftpb.HardState
//	0x03                  truncated state: index and term (2 x 8 B BE) of the
//	                      entry just before the first retained entry
//	0x04                  snapshot metadata, a marshalled raftpb.SnapshotMetadata
//	0x05                  snapshot data, raw bytes
//	0x06                  identity: cluster ID and member ID (2 x 8 B BE)
const (
	prefixVersion   byte = 0x00
	prefixEntry     byte = 0x01
	prefixHardState byte = 0x02
	prefixTrunc     byte = 0x03
	prefixSnapMeta  byte = 0x04
	prefixSnapData  byte = 0x05
	prefixIdentity  byte = 0x06
)

// formatVersion is the on-disk layout written by this package. Open refuses a
// store with any other version.
const formatVersion uint64 = 1

var (
	keyVersion   = []byte{prefixVersion}
	keyHardState = []byte{prefixHardState}
	keyTrunc     = []byte{prefixTrunc}
	keySnapMeta  = []byte{prefixSnapMeta}
	keySnapData  = []byte{prefixSnapData}
	keyIdentity  = []byte{prefixIdentity}

	// entryKeysStart and entryKeysEnd bound every entry key: [start, end).
	entryKeysStart = []byte{prefixEntry}
	entryKeysEnd   = []byte{prefixEntry + 1}
)

// entryKey returns the key of the log entry with the given index.
func entryKey(index uint64) []byte {
	k := make([]byte, 9)
	k[0] = prefixEntry
	binary.BigEndian.PutUint64(k[1:], index)
	return k
}

// entryKeyUpper returns the exclusive upper bound of entry keys with indexes
// at or below index. It is entryKeysEnd when index is the largest uint64.
func entryKeyUpper(index uint64) []byte {
	if index == ^uint64(0) {
		return entryKeysEnd
	}
	return entryKey(index + 1)
}

// parseEntryKey returns the index encoded in an entry key.
func parseEntryKey(k []byte) (uint64, bool) {
	if len(k) != 9 || k[0] != prefixEntry {
		return 0, false
	}
	return binary.BigEndian.Uint64(k[1:]), true
}

// keyName names a key for error messages.
func keyName(k []byte) string {
	if len(k) == 0 {
		return "empty key"
	}
	switch k[0] {
	case prefixVersion:
		return "format version"
	case prefixEntry:
		if i, ok := parseEntryKey(k); ok {
			return fmt.Sprintf("entry %d", i)
		}
		return fmt.Sprintf("malformed entry key %x", k)
	case prefixHardState:
		return "hard state"
	case prefixTrunc:
		return "truncated state"
	case prefixSnapMeta:
		return "snapshot metadata"
	case prefixSnapData:
		return "snapshot data"
	case prefixIdentity:
		return "identity"
	}
	return fmt.Sprintf("unknown key %x", k)
}

// truncState records the entry just before the first retained one: its index
// is FirstIndex()-1 and its term answers Term(FirstIndex()-1).
type truncState struct {
	index, term uint64
}

func encodePair(a, b uint64) []byte {
	v := make([]byte, 16)
	binary.BigEndian.PutUint64(v, a)
	binary.BigEndian.PutUint64(v[8:], b)
	return v
}

func decodePair(v []byte) (uint64, uint64, error) {
	if len(v) != 16 {
		return 0, 0, fmt.Errorf("value of %d bytes, want 16", len(v))
	}
	return binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:]), nil
}

func encodeUint64(x uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, x)
}

func decodeUint64(v []byte) (uint64, error) {
	if len(v) != 8 {
		return 0, fmt.Errorf("value of %d bytes, want 8", len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// decodeEntry decodes the value stored under the entry key of index and
// checks that the entry carries that index.
func decodeEntry(index uint64, v []byte) (*raftpb.Entry, error) {
	e := new(raftpb.Entry)
	if err := proto.Unmarshal(v, e); err != nil {
		return nil, err
	}
	if e.GetIndex() != index {
		return nil, fmt.Errorf("entry carries index %d", e.GetIndex())
	}
	return e, nil
}

func decodeIdentity(v []byte) (storage.Identity, error) {
	c, m, err := decodePair(v)
	return storage.Identity{ClusterID: c, MemberID: m}, err
}

// corrupt wraps a decoding or read-consistency failure of the record under key
// with storage.ErrCorrupt, naming the store directory and the key.
func corrupt(dir string, key []byte, err error) error {
	return fmt.Errorf("pebblestore: %s: %s: %w: %w", dir, keyName(key), storage.ErrCorrupt, err)
}
