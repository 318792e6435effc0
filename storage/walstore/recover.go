package walstore

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/server/v3/storage/wal/walpb"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
)

// Recovery of the WAL on Open.
//
// etcd's WAL frames each record as an 8-byte little-endian length (the low 56
// bits; the top byte flags 0-7 bytes of padding to 8-byte alignment) followed
// by a marshalled walpb.Record, whose Crc is the CRC-32C of the data of every
// record so far in the WAL (each segment starts with a CRC record carrying
// the value the previous segment ended with). Segments are preallocated with
// zeros, and a zero length ends a segment.
//
// etcd's rule for the last segment, which this package keeps: a record cut
// short or with a zeroed 512-byte sector is a torn write and is truncated
// away (wal.Repair); any other damage refuses to start. That rule alone would
// also take damage in the middle of the last segment (a zeroed length field,
// a length running past the end, a zeroed sector) for a torn tail and drop
// every record after it, acknowledged ones included. A Store writes one
// synced Save at a time and ends every write with a hard state or snapshot
// record, so a torn write can only be followed by more of itself:
// provenSynced treats a hard state or snapshot record followed by a record
// that continues its CRC chain, found after the damage, as proof that the
// damage was synced, which makes it corruption.

// segment is a WAL segment file, named <seq>-<index>.wal in hex: index is the
// first entry index the segment was started for.
type segment struct {
	name       string
	seq, index uint64
}

// listSegments returns the segments of the WAL in dir in sequence order.
func listSegments(dir string) ([]segment, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var segs []segment
	for _, de := range des {
		var sg segment
		if !strings.HasSuffix(de.Name(), ".wal") {
			continue
		}
		if _, err := fmt.Sscanf(de.Name(), "%016x-%016x.wal", &sg.seq, &sg.index); err != nil {
			continue
		}
		sg.name = de.Name()
		segs = append(segs, sg)
	}
	slices.SortFunc(segs, func(a, b segment) int { return cmp.Compare(a.seq, b.seq) })
	return segs, nil
}

// readFrom returns the segments wal.Open reads for a WAL opened at index:
// from the last one started at or below index to the end. ok is false when
// no segment qualifies or the sequence numbers have a gap.
func readFrom(segs []segment, index uint64) (from []segment, ok bool) {
	k := -1
	for i, sg := range segs {
		if sg.index <= index {
			k = i
		}
	}
	if k < 0 {
		return nil, false
	}
	for i := k + 1; i < len(segs); i++ {
		if segs[i].seq != segs[i-1].seq+1 {
			return nil, false
		}
	}
	return segs[k:], true
}

const frameHeader = 8

// frameSize decodes a length field: the record's size and its padding.
func frameSize(lenField uint64) (rec, pad uint64) {
	rec = lenField &^ (0xff << 56)
	if int64(lenField) < 0 {
		pad = (lenField >> 56) & 0x7
	}
	return rec, pad
}

// frameEnd walks the frames of a segment by their length fields and returns
// the offset where they end: the first zero length field, a frame that runs
// past the end of the file, or the end of the file.
func frameEnd(path string) (end, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	size = fi.Size()
	r := bufio.NewReaderSize(f, 64<<10)
	var lb [frameHeader]byte
	off := int64(0)
	for off+frameHeader <= size {
		if _, err := io.ReadFull(r, lb[:]); err != nil {
			return 0, 0, err
		}
		l := binary.LittleEndian.Uint64(lb[:])
		if l == 0 {
			break
		}
		rec, pad := frameSize(l)
		n := int64(rec + pad)
		if n < 0 || off+frameHeader+n > size {
			break
		}
		if _, err := r.Discard(int(n)); err != nil {
			return 0, 0, err
		}
		off += frameHeader + n
	}
	return off, size, nil
}

// provenSynced reports whether the segment at path holds, after offset from,
// a hard state or snapshot record followed by a record that continues its
// CRC chain: the end of a completed write followed by a later write, so the
// data at from had been synced. It returns the offset of that record.
func provenSynced(path string, from int64) (at int64, ok bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return 0, false, err
	}
	start := from + frameHeader
	// Most of a segment is preallocated space that was never written: find
	// where written data ends before reading anything into memory.
	if last, err := lastNonZero(f, start, fi.Size()); err != nil || last <= start {
		return 0, false, err
	}
	data := make([]byte, fi.Size()-start)
	if _, err := f.ReadAt(data, start); err != nil && !errors.Is(err, io.EOF) {
		return 0, false, err
	}
	// Frames are 8-byte aligned; start is, because from is a frame offset.
	for p := 0; p+frameHeader <= len(data); p += frameHeader {
		first, next, ok := recordAt(data, p)
		if !ok || (first.GetType() != wal.StateType && first.GetType() != wal.SnapshotType) {
			continue
		}
		second, _, ok := recordAt(data, next)
		if ok && second.GetCrc() == crc32.Update(first.GetCrc(), crcTable, second.GetData()) {
			return start + int64(p), true, nil
		}
	}
	return 0, false, nil
}

// recordAt decodes the frame at offset p of data, returning its record and
// the offset of the next frame.
func recordAt(data []byte, p int) (rec *walpb.Record, next int, ok bool) {
	if p < 0 || p+frameHeader > len(data) {
		return nil, 0, false
	}
	n, pad := frameSize(binary.LittleEndian.Uint64(data[p:]))
	if n < 2 || n > uint64(len(data)-p-frameHeader) || pad > uint64(len(data)-p-frameHeader)-n {
		return nil, 0, false
	}
	body := data[p+frameHeader : p+frameHeader+int(n)]
	// A record starts with its type: field 1, a varint of 1..5.
	if body[0] != 0x08 || body[1] < 1 || body[1] > 5 {
		return nil, 0, false
	}
	rec = new(walpb.Record)
	if err := proto.Unmarshal(body, rec); err != nil {
		return nil, 0, false
	}
	return rec, p + frameHeader + int(n+pad), true
}

// lastNonZero returns the offset just past the last non-zero byte of f in
// [from, size), or from when there is none. It reads only the ranges that
// the file system reports as holding data.
func lastNonZero(f *os.File, from, size int64) (int64, error) {
	last := from
	buf := make([]byte, 64<<10)
	zeros := make([]byte, len(buf))
	err := dataRanges(f, from, size, func(lo, hi int64) error {
		for off := lo; off < hi; {
			n := min(int64(len(buf)), hi-off)
			if _, err := f.ReadAt(buf[:n], off); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			if !bytes.Equal(buf[:n], zeros[:n]) {
				i := n - 1
				for buf[i] == 0 {
					i--
				}
				last = max(last, off+i+1)
			}
			off += n
		}
		return nil
	})
	return last, err
}

// walProblem is the first record of the WAL that fails its checks.
type walProblem struct {
	path string
	off  int64
	torn bool // cut short or zeroed in the last segment: etcd's torn write
	err  error
}

func (p *walProblem) error() error {
	return corrupt(p.path, fmt.Errorf("record at offset %d: %w", p.off, p.err))
}

// replayed is the state a WAL describes.
type replayed struct {
	hs   *raftpb.HardState
	ents []*raftpb.Entry // the entries after the start index
}

// replay reads the segments wal.Open reads for a WAL opened at (index, term),
// with one decoder per segment so that a failure names its segment, and
// applies the records in order. It returns the first record that fails its
// checks as a walProblem.
//
// It exists next to wal.ReadAll (which Open still calls, to append after the
// last record) because ReadAll ignores entries at or below the start index,
// including their overwrite: an entry written at or below index after
// entries above it drops those, and ReadAll would bring them back.
func replay(dir string, index, term uint64) (*replayed, *walProblem, error) {
	segs, err := listSegments(dir)
	if err != nil {
		return nil, nil, err
	}
	from, ok := readFrom(segs, index)
	if !ok {
		return nil, &walProblem{path: dir, err: fmt.Errorf("no unbroken run of segments from index %d: %v", index, segs)}, nil
	}
	r := &replayed{hs: new(raftpb.HardState)}
	var prevCRC uint32
	matched := false
	for k, sg := range from {
		path := filepath.Join(dir, sg.name)
		end, p, err := r.segment(path, k > 0, prevCRC, index, term, &matched)
		if err != nil || p != nil {
			if p != nil {
				p.torn = p.torn && k == len(from)-1
			}
			return nil, p, err
		}
		prevCRC = end
	}
	if !matched {
		last := filepath.Join(dir, from[len(from)-1].name)
		return nil, &walProblem{path: last, err: fmt.Errorf("%w: no record of the log start, index %d term %d", wal.ErrSnapshotNotFound, index, term)}, nil
	}
	return r, nil, nil
}

// segment replays one segment. When chained, its first CRC record must
// carry prevCRC, the CRC the previous segment ended with. It returns the CRC
// the segment ends with.
func (r *replayed) segment(path string, chained bool, prevCRC uint32, index, term uint64, matched *bool) (uint32, *walProblem, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = f.Close() }()
	dec := wal.NewDecoder(fileutil.NewFileReader(f))
	rec := new(walpb.Record)
	for first := true; ; first = false {
		off := dec.LastOffset()
		err := dec.Decode(rec)
		if errors.Is(err, io.EOF) {
			return dec.LastCRC(), nil, nil
		}
		if err != nil {
			return 0, &walProblem{path: path, off: off, err: err, torn: errors.Is(err, io.ErrUnexpectedEOF)}, nil
		}
		if err := r.apply(dec, rec, first && chained, prevCRC, index, term, matched); err != nil {
			return 0, &walProblem{path: path, off: off, err: fmt.Errorf("record of type %d: %w", rec.GetType(), err)}, nil
		}
	}
}

// apply applies one decoded record.
func (r *replayed) apply(dec wal.Decoder, rec *walpb.Record, chained bool, prevCRC uint32, index, term uint64, matched *bool) error {
	switch rec.GetType() {
	case wal.CrcType:
		if chained && rec.GetCrc() != prevCRC {
			return fmt.Errorf("%w: segment starts with CRC %08x, the previous one ended with %08x", wal.ErrCRCMismatch, rec.GetCrc(), prevCRC)
		}
		if crc := dec.LastCRC(); crc != 0 && rec.GetCrc() != crc {
			return fmt.Errorf("%w: CRC record %08x, computed %08x", wal.ErrCRCMismatch, rec.GetCrc(), crc)
		}
		dec.UpdateCRC(rec.GetCrc())
	case wal.EntryType:
		e := new(raftpb.Entry)
		if err := proto.Unmarshal(rec.GetData(), e); err != nil {
			return err
		}
		if e.GetIndex() <= index {
			// Log matching: it drops every entry after it.
			clear(r.ents)
			r.ents = r.ents[:0]
			return nil
		}
		off := e.GetIndex() - index - 1
		if off > uint64(len(r.ents)) {
			return fmt.Errorf("%w: entry %d follows entry %d", wal.ErrSliceOutOfRange, e.GetIndex(), index+uint64(len(r.ents)))
		}
		clear(r.ents[off:])
		r.ents = append(r.ents[:off], e)
	case wal.StateType:
		hs := new(raftpb.HardState)
		if err := proto.Unmarshal(rec.GetData(), hs); err != nil {
			return err
		}
		r.hs = hs
	case wal.SnapshotType:
		sn := new(walpb.Snapshot)
		if err := proto.Unmarshal(rec.GetData(), sn); err != nil {
			return err
		}
		if sn.GetIndex() == index {
			if sn.GetTerm() != term {
				return fmt.Errorf("%w: record of index %d has term %d, want %d", wal.ErrSnapshotMismatch, index, sn.GetTerm(), term)
			}
			*matched = true
		}
	case wal.MetadataType:
	default:
		return errors.New("unknown record type")
	}
	return nil
}

// checkLastSegment looks at where the frames of the last segment read end
// and fails, naming the segment, when data after that point proves that it
// was not the end of the log (see provenSynced). wal.ReadAll zeroes that
// data, so this must run first.
func checkLastSegment(dir string, index uint64) error {
	segs, err := listSegments(dir)
	if err != nil {
		return fmt.Errorf("walstore: list %s: %w", dir, err)
	}
	from, ok := readFrom(segs, index)
	if !ok {
		return nil // wal.Open fails and diagnose reports it
	}
	path := filepath.Join(dir, from[len(from)-1].name)
	end, size, err := frameEnd(path)
	if err != nil {
		return fmt.Errorf("walstore: read %s: %w", path, err)
	}
	if end >= size {
		return nil
	}
	if at, ok, err := provenSynced(path, end); err != nil {
		return fmt.Errorf("walstore: read %s: %w", path, err)
	} else if ok {
		return corrupt(path, fmt.Errorf("frames end at offset %d, but a later write starts at offset %d", end, at))
	}
	return nil
}

// openWAL opens the WAL in dir for appending, reading it from the record of
// the entry (index, term) on, and returns the latest hard state and the
// entries after index. A torn final record is repaired once; any other
// damage returns an error wrapping storage.ErrCorrupt that names the
// segment.
func openWAL(lg *zap.Logger, dir string, index, term uint64) (*wal.WAL, *raftpb.HardState, []*raftpb.Entry, error) {
	if err := checkLastSegment(dir, index); err != nil {
		return nil, nil, nil, err
	}
	var r *replayed
	for repaired := false; ; repaired = true {
		var p *walProblem
		var err error
		r, p, err = replay(dir, index, term)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("walstore: read %s: %w", dir, err)
		}
		if p == nil {
			break
		}
		if !p.torn || repaired {
			return nil, nil, nil, p.error()
		}
		if at, ok, perr := provenSynced(p.path, p.off); perr != nil {
			return nil, nil, nil, fmt.Errorf("walstore: read %s: %w", p.path, perr)
		} else if ok {
			return nil, nil, nil, corrupt(p.path, fmt.Errorf("record at offset %d looks torn, but a later write starts at offset %d: %w", p.off, at, p.err))
		}
		lg.Warn("walstore: repairing a torn final WAL record", zap.String("segment", p.path), zap.Int64("offset", p.off), zap.Error(p.err))
		if !wal.Repair(lg, dir) {
			return nil, nil, nil, p.error()
		}
	}
	w, err := readWAL(lg, dir, &walpb.Snapshot{Index: new(index), Term: new(term)})
	if err != nil {
		return nil, nil, nil, openFailure(dir, err)
	}
	return w, r.hs, r.ents, nil
}

// openFailure classifies an error of etcd's wal.Open or ReadAll. A failure
// to reach a file (a *fs.PathError from the file system: permission, a
// read-only mount, too many open files) or a segment another process holds
// locked (fileutil.ErrLocked) says nothing about the data and is returned as
// an I/O error; anything else is the WAL's content failing a check (replay
// read every segment before wal.Open) and wraps storage.ErrCorrupt.
func openFailure(dir string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) || errors.Is(err, fileutil.ErrLocked) {
		return fmt.Errorf("walstore: open the WAL in %s: %w", dir, err)
	}
	return corrupt(dir, err)
}

// readWAL opens the WAL and reads it to its end, which readies it for
// appending. A panic in etcd's decoding (it panics on a record whose checksum
// matches but whose data does not decode) becomes an error.
func readWAL(lg *zap.Logger, dir string, start *walpb.Snapshot) (w *wal.WAL, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("reading the WAL panicked: %v", r)
		}
		if err != nil && w != nil {
			_ = w.Close()
			w = nil
		}
	}()
	w, err = wal.Open(lg, dir, start)
	if err != nil {
		return nil, err
	}
	_, _, _, err = w.ReadAll()
	return w, err
}
