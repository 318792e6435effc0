package walstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"github.com/quorumlock/quorumlock/storage"
)

// metaName is the file that says which WAL and which snapshot file make up
// the store, how far the log was compacted, and whose store it is. Replacing
// it (atomically) is the commit point of SaveSnapshot and Compact.
const metaName = "META"

// meta is the content of the META file.
//
// Layout, 72 bytes, integers big-endian:
//
//	0   4  magic "QLWM"
//	4   4  format version (1)
//	8   4  flags: 1 = identity recorded, 2 = snapshot recorded
//	12  8  cluster ID
//	20  8  member ID
//	28  8  WAL generation: the WAL is in directory wal-<generation, 16 hex digits>
//	36  8  index of the last discarded entry (FirstIndex()-1)
//	44  8  its term
//	52  8  snapshot index
//	60  8  snapshot term
//	68  4  CRC-32C (Castagnoli) of bytes 0..67
type meta struct {
	hasIdentity bool
	identity    storage.Identity
	walGen      uint64
	prevIndex   uint64
	prevTerm    uint64
	hasSnap     bool
	snapIndex   uint64
	snapTerm    uint64
}

const (
	metaMagic   = "QLWM"
	metaVersion = 1
	metaSize    = 72

	flagIdentity = 1 << 0
	flagSnapshot = 1 << 1
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func (m meta) encode() []byte {
	b := make([]byte, 0, metaSize)
	b = append(b, metaMagic...)
	b = binary.BigEndian.AppendUint32(b, metaVersion)
	var flags uint32
	if m.hasIdentity {
		flags |= flagIdentity
	}
	if m.hasSnap {
		flags |= flagSnapshot
	}
	b = binary.BigEndian.AppendUint32(b, flags)
	for _, v := range []uint64{m.identity.ClusterID, m.identity.MemberID, m.walGen, m.prevIndex, m.prevTerm, m.snapIndex, m.snapTerm} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

func decodeMeta(b []byte) (meta, error) {
	if len(b) != metaSize {
		return meta{}, fmt.Errorf("%d bytes, want %d", len(b), metaSize)
	}
	if string(b[:4]) != metaMagic {
		return meta{}, fmt.Errorf("bad magic %q", b[:4])
	}
	if got, want := binary.BigEndian.Uint32(b[68:]), crc32.Checksum(b[:68], crcTable); got != want {
		return meta{}, fmt.Errorf("checksum %08x, computed %08x", got, want)
	}
	if v := binary.BigEndian.Uint32(b[4:]); v != metaVersion {
		return meta{}, fmt.Errorf("format version %d, this build reads only %d", v, metaVersion)
	}
	flags := binary.BigEndian.Uint32(b[8:])
	if flags&^(flagIdentity|flagSnapshot) != 0 {
		return meta{}, fmt.Errorf("unknown flags %#x", flags)
	}
	u := func(off int) uint64 { return binary.BigEndian.Uint64(b[off:]) }
	m := meta{
		hasIdentity: flags&flagIdentity != 0,
		identity:    storage.Identity{ClusterID: u(12), MemberID: u(20)},
		walGen:      u(28),
		prevIndex:   u(36),
		prevTerm:    u(44),
		hasSnap:     flags&flagSnapshot != 0,
		snapIndex:   u(52),
		snapTerm:    u(60),
	}
	if m.walGen == 0 {
		return meta{}, errors.New("WAL generation 0")
	}
	if m.hasSnap && m.prevIndex > m.snapIndex {
		return meta{}, fmt.Errorf("log discarded through %d, past the snapshot at %d", m.prevIndex, m.snapIndex)
	}
	if !m.hasSnap && m.prevIndex != 0 {
		return meta{}, fmt.Errorf("log discarded through %d without a snapshot", m.prevIndex)
	}
	return m, nil
}

// walDirName is the directory of WAL generation gen.
func walDirName(gen uint64) string { return fmt.Sprintf("wal-%016x", gen) }

// snapFileName is the file of the snapshot with the given term and index.
func snapFileName(term, index uint64) string { return fmt.Sprintf("%016x-%016x.snap", term, index) }

// tmpSuffix marks a file being written; Open removes leftovers.
const tmpSuffix = ".tmp"

// writeFileAtomic replaces dir/name with what write produces: it writes a
// temporary file, syncs it, renames it over name and syncs dir, so that after
// a crash dir/name is either the old or the new file, whole.
func writeFileAtomic(dir, name string, sync func(*os.File) error, write func(w io.Writer) error) (err error) {
	tmp := filepath.Join(dir, name+tmpSuffix)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := write(bw); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := sync(f); err != nil {
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir, sync)
}

// syncDir makes the names in dir durable (a rename, a new or removed file).
func syncDir(dir string, sync func(*os.File) error) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = sync(d)
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}
