package walstore

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// A snapshot file holds one raft snapshot.
//
// Layout, integers big-endian:
//
//	magic "QLWS" (4) | format version 1 (4) | metadata length m (4) |
//	metadata: a marshalled raftpb.SnapshotMetadata (m) | data length d (8) |
//	data (d) | CRC-32C (Castagnoli) of everything before it (4)
//
// etcd's own snap.Snapshotter is not used: it writes the file in place (a
// crash can leave half a file under the final name) and, on load, renames a
// damaged file aside and falls back to an older one, where a replica must
// refuse to start.
const (
	snapMagic   = "QLWS"
	snapVersion = 1
)

// writeSnap writes snap in the snapshot file format.
func writeSnap(w io.Writer, snap *raftpb.Snapshot) error {
	mb, err := proto.Marshal(raftpb.EnsureSnapshotMetadata(proto.Clone(snap.GetMetadata()).(*raftpb.SnapshotMetadata)))
	if err != nil {
		return fmt.Errorf("marshal snapshot metadata: %w", err)
	}
	h := crc32.New(crcTable)
	mw := io.MultiWriter(w, h)
	head := append([]byte(snapMagic), make([]byte, 8)...)
	binary.BigEndian.PutUint32(head[4:], snapVersion)
	binary.BigEndian.PutUint32(head[8:], uint32(len(mb)))
	head = append(head, mb...)
	head = binary.BigEndian.AppendUint64(head, uint64(len(snap.GetData())))
	if _, err := mw.Write(head); err != nil {
		return err
	}
	if _, err := mw.Write(snap.GetData()); err != nil {
		return err
	}
	_, err = w.Write(binary.BigEndian.AppendUint32(nil, h.Sum32()))
	return err
}

// decodeSnap decodes and checks a snapshot file's contents.
func decodeSnap(b []byte) (*raftpb.Snapshot, error) {
	const fixed = 4 + 4 + 4 + 8 + 4
	if len(b) < fixed {
		return nil, fmt.Errorf("%d bytes, shorter than any snapshot file", len(b))
	}
	if string(b[:4]) != snapMagic {
		return nil, fmt.Errorf("bad magic %q", b[:4])
	}
	body := b[:len(b)-4]
	if got, want := binary.BigEndian.Uint32(b[len(b)-4:]), crc32.Checksum(body, crcTable); got != want {
		return nil, fmt.Errorf("checksum %08x, computed %08x", got, want)
	}
	if v := binary.BigEndian.Uint32(b[4:]); v != snapVersion {
		return nil, fmt.Errorf("format version %d, this build reads only %d", v, snapVersion)
	}
	m := uint64(binary.BigEndian.Uint32(b[8:]))
	if 12+m+8 > uint64(len(body)) {
		return nil, fmt.Errorf("metadata length %d past the end", m)
	}
	d := binary.BigEndian.Uint64(body[12+m:])
	if 12+m+8+d != uint64(len(body)) {
		return nil, fmt.Errorf("data length %d, file holds %d", d, uint64(len(body))-12-m-8)
	}
	md := new(raftpb.SnapshotMetadata)
	if err := proto.Unmarshal(body[12:12+m], md); err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	snap := &raftpb.Snapshot{Metadata: raftpb.EnsureSnapshotMetadata(md)}
	if d > 0 {
		snap.Data = body[12+m+8:]
	}
	return snap, nil
}

// readSnap reads and checks the snapshot file at path, which must hold the
// snapshot with the given index and term. Errors wrap storage.ErrCorrupt
// (through corrupt) except for a failure to read the file.
func readSnap(path string, index, term uint64) (*raftpb.Snapshot, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, corrupt(path, err)
		}
		return nil, fmt.Errorf("walstore: read %s: %w", path, err)
	}
	snap, err := decodeSnap(b)
	if err != nil {
		return nil, corrupt(path, err)
	}
	if md := snap.GetMetadata(); md.GetIndex() != index || md.GetTerm() != term {
		return nil, corrupt(path, fmt.Errorf("holds the snapshot at index %d term %d, want index %d term %d",
			md.GetIndex(), md.GetTerm(), index, term))
	}
	return snap, nil
}
