package pebblestore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/quorumlock/quorumlock/storage"
)

// Pebble replays its write-ahead log on open and stops at the first chunk of
// the newest WAL file that fails its checks, taking it for the torn tail of a
// write that never completed. It confirms corruption only through a
// sync-offset field that its newest chunk format carries, and only from the
// next 32 KiB block on: a damaged record in the final block (or in a WAL
// written in the older chunk format, as the first WAL of a new database is)
// silently drops every later record, acknowledged ones included.
//
// A Store commits one synced batch at a time, so at most one WAL record, the
// last one, can be incomplete after a crash. checkWALTail uses that: a valid
// record that starts after the first bad chunk proves the bad chunk was
// synced, so it is corruption and Open must fail instead of dropping the
// records behind it.
//
// The chunk layout below is Pebble's record format (record/record.go); only
// chunks that carry the log number are considered, so an unknown or older
// format can never produce a false alarm, only a missed one.
const (
	walBlockSize        = 32 << 10
	walLegacyHeaderSize = 7
	walRecyclableHeader = walLegacyHeaderSize + 4 // + log number
	walSyncHeader       = walRecyclableHeader + 8 // + synced offset
)

// walChunk is the header layout of a chunk encoding: whether it begins a
// record and its header size; size 0 marks an encoding this check ignores
// (invalid, or the legacy format without a log number).
type walChunk struct {
	first      bool
	headerSize int
}

var walChunks = [256]walChunk{
	5:  {first: true, headerSize: walRecyclableHeader},  // recyclable, full
	6:  {first: true, headerSize: walRecyclableHeader},  // recyclable, first
	7:  {first: false, headerSize: walRecyclableHeader}, // recyclable, middle
	8:  {first: false, headerSize: walRecyclableHeader}, // recyclable, last
	9:  {first: true, headerSize: walSyncHeader},        // WAL sync, full
	10: {first: true, headerSize: walSyncHeader},        // WAL sync, first
	11: {first: false, headerSize: walSyncHeader},       // WAL sync, middle
	12: {first: false, headerSize: walSyncHeader},       // WAL sync, last
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// walChecksum is Pebble's masked CRC-32C of a chunk.
func walChecksum(b []byte) uint32 {
	c := crc32.Update(0, castagnoli, b)
	return (c>>15 | c<<17) + 0xa282ead8
}

// validChunkAt reports whether a chunk of log logNum with a correct checksum
// starts at offset p of data, and whether it begins a record.
func validChunkAt(data []byte, p int, logNum uint32) (ok, first bool) {
	if p+walLegacyHeaderSize > len(data) {
		return false, false
	}
	kind := walChunks[data[p+6]]
	if kind.headerSize == 0 {
		return false, false
	}
	blockEnd := min(len(data), (p/walBlockSize+1)*walBlockSize)
	start := p + kind.headerSize
	if start > blockEnd || binary.LittleEndian.Uint32(data[p+7:p+11]) != logNum {
		return false, false
	}
	end := start + int(binary.LittleEndian.Uint16(data[p+4:p+6]))
	if end > blockEnd || binary.LittleEndian.Uint32(data[p:p+4]) != walChecksum(data[p+6:end]) {
		return false, false
	}
	return true, kind.first
}

// chunkAt reports whether a valid chunk starts at offset p of data,
// whether it begins a record, and its size (header and payload) when valid.
type chunkAt func(data []byte, p int) (ok, first bool, size int)

// walChunkAt is chunkAt for the chunks of WAL logNum.
func walChunkAt(logNum uint32) chunkAt {
	return func(data []byte, p int) (bool, bool, int) {
		ok, first := validChunkAt(data, p, logNum)
		if !ok {
			return false, false, 0
		}
		return true, first, walChunks[data[p+6]].headerSize + int(binary.LittleEndian.Uint16(data[p+4:p+6]))
	}
}

// firstBadChunk parses the chunks of data in order, as Pebble's reader does,
// and returns the offset of the first one that fails its checks, or -1 when
// every chunk is valid up to the end of data. The writer pads a block
// whose rest cannot hold a header of maxHeader bytes with zeros.
func firstBadChunk(data []byte, at chunkAt, maxHeader int) int {
	p := 0
	for p < len(data) {
		blockEnd := min(len(data), (p/walBlockSize+1)*walBlockSize)
		if blockEnd-p < maxHeader && allZero(data[p:blockEnd]) {
			p = blockEnd
			continue
		}
		ok, _, size := at(data, p)
		if !ok {
			return p
		}
		p += size
	}
	return -1
}

// syncedDamage reads the file at path and returns an error wrapping
// storage.ErrCorrupt, naming what (a WAL, the MANIFEST), the file and the
// offset, when a chunk that Pebble would take for a torn tail is followed
// by a valid chunk that begins a record: the damaged one was synced.
func syncedDamage(fs vfs.FS, path, what string, at chunkAt, maxHeader int) error {
	f, err := fs.Open(path)
	if err != nil {
		return fmt.Errorf("pebblestore: open %s: %w", path, err)
	}
	data, err := readAll(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pebblestore: read %s: %w", path, err)
	}
	bad := firstBadChunk(data, at, maxHeader)
	if bad < 0 {
		return nil
	}
	for p := bad + 1; p+walLegacyHeaderSize <= len(data); p++ {
		if data[p+6] == 0 {
			// No chunk begins here: a chunk's type byte (offset 6) is
			// never zero. Skip to where the next nonzero byte could be
			// one: a preallocated WAL is zeros after its last record
			// (prealloc.go), megabytes of them.
			q := nextNonZero(data, p+6)
			if q < 0 {
				break
			}
			p = q - 6 - 1 // the loop's p++ makes it q - 6
			continue
		}
		if ok, first, _ := at(data, p); ok && first {
			return fmt.Errorf("pebblestore: %s: damaged %s record at offset %d is followed by a valid record at offset %d, so it was synced: %w",
				path, what, bad, p, storage.ErrCorrupt)
		}
	}
	return nil
}

// readAll reads f whole into a buffer of its size, where io.ReadAll would
// grow one by doubling (a WAL is preallocated to about 9 MiB).
func readAll(f vfs.File) ([]byte, error) {
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	buf := bytes.NewBuffer(make([]byte, 0, info.Size()+bytes.MinRead))
	_, err = buf.ReadFrom(f)
	return buf.Bytes(), err
}

// nextNonZero returns the offset of the first nonzero byte of b at or after
// from, or -1 when there is none. It compares blocks at a time, as the
// runs it skips are long.
func nextNonZero(b []byte, from int) int {
	var zeros [4096]byte
	for from < len(b) {
		n := min(len(b)-from, len(zeros))
		if !bytes.Equal(b[from:from+n], zeros[:n]) {
			for b[from] == 0 {
				from++
			}
			return from
		}
		from += n
	}
	return -1
}

func allZero(b []byte) bool { return nextNonZero(b, 0) < 0 }

// checkWALTail reads the newest WAL file in dir and returns an error wrapping
// storage.ErrCorrupt, naming the file and offset, when a record that Pebble
// would drop as a torn tail is followed by a valid record of the same log.
func checkWALTail(fs vfs.FS, dir string) error {
	names, err := fs.List(dir)
	if err != nil {
		return fmt.Errorf("pebblestore: list %s: %w", dir, err)
	}
	var newest uint64
	var name string
	for _, n := range names {
		num, ok := strings.CutSuffix(n, ".log")
		if !ok {
			continue
		}
		v, err := strconv.ParseUint(num, 10, 32)
		if err != nil || (name != "" && v <= newest) {
			continue
		}
		newest, name = v, n
	}
	if name == "" {
		return nil
	}
	return syncedDamage(fs, fs.PathJoin(dir, name), "WAL", walChunkAt(uint32(newest)), walSyncHeader)
}

// Pebble reads its MANIFEST (the list of tables and the log position they
// cover) the same way, and stops without an error at the first record
// that fails its checks, taking it for a torn final write: damage in the
// middle of the MANIFEST silently forgot every table recorded after it,
// with their entries (the WAL they came from is deleted once they are
// flushed). Pebble writes one version edit at a time and syncs it before
// the next, so here too a valid record after a bad chunk proves the bad
// chunk was synced, and checkManifestTail fails Open naming the MANIFEST.
// The MANIFEST uses the legacy chunk format (a 7-byte header without a log
// number).
const (
	manifestFull  = 1
	manifestFirst = 2
	manifestLast  = 4
)

// manifestChunkAt is chunkAt for the MANIFEST's legacy chunks.
func manifestChunkAt(data []byte, p int) (ok, first bool, size int) {
	if p+walLegacyHeaderSize > len(data) {
		return false, false, 0
	}
	typ := data[p+6]
	if typ < manifestFull || typ > manifestLast {
		return false, false, 0
	}
	blockEnd := min(len(data), (p/walBlockSize+1)*walBlockSize)
	end := p + walLegacyHeaderSize + int(binary.LittleEndian.Uint16(data[p+4:p+6]))
	if end > blockEnd || binary.LittleEndian.Uint32(data[p:p+4]) != walChecksum(data[p+6:end]) {
		return false, false, 0
	}
	return true, typ == manifestFull || typ == manifestFirst, end - p
}

// checkManifestTail reads the current MANIFEST of dir (the one the newest
// manifest marker names) and returns an error wrapping storage.ErrCorrupt,
// naming the file and offset, when a chunk that Pebble would take for a
// torn tail is followed by a valid record.
func checkManifestTail(fs vfs.FS, dir string) error {
	names, err := fs.List(dir)
	if err != nil {
		return fmt.Errorf("pebblestore: list %s: %w", dir, err)
	}
	var iter uint64
	var name string
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, "marker.manifest.")
		if !ok {
			continue
		}
		num, file, ok := strings.Cut(rest, ".")
		v, err := strconv.ParseUint(num, 10, 64)
		if !ok || err != nil || (name != "" && v <= iter) {
			continue
		}
		iter, name = v, file
	}
	if name == "" {
		return nil
	}
	path := fs.PathJoin(dir, name)
	if _, err := fs.Stat(path); err != nil {
		// A missing MANIFEST is Pebble's to report (missingPiece).
		return nil
	}
	return syncedDamage(fs, path, "MANIFEST", manifestChunkAt, walLegacyHeaderSize)
}
