package walstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/server/v3/storage/wal/walpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// faultSegmentSize is the WAL segment size of the fault tests: small, so
// that they read and rewrite whole segments quickly.
const faultSegmentSize = 64 << 10

func openT(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open %s: %v", dir, err)
	}
	return s
}

func testEntry(index uint64, data string) *raftpb.Entry {
	return &raftpb.Entry{Index: new(index), Term: new(uint64(1)), Data: []byte(data)}
}

// entryData is the data of entry i as saveEach writes it: its index and
// padding that makes it easy to find in a file.
func entryData(i uint64) string {
	return fmt.Sprintf("entry %d|%s", i, strings.Repeat("x", 80))
}

// saveEach saves entries lo..hi one Save each, every one with a hard state
// committing it.
func saveEach(t testing.TB, s *Store, lo, hi uint64) {
	t.Helper()
	for i := lo; i <= hi; i++ {
		if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(i)}, []*raftpb.Entry{testEntry(i, entryData(i))}); err != nil {
			t.Fatalf("Save(%d): %v", i, err)
		}
	}
}

// snapshotAt20 fills s with entries 1..40 (saveEach), saves a snapshot at
// index 20 and compacts the log to 10: a store with a snapshot, a log
// that keeps entries before it, and several segments.
func snapshotAt20(t testing.TB, s *Store) {
	t.Helper()
	saveEach(t, s, 1, 40)
	if err := s.SaveSnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: new(uint64(20)), Term: new(uint64(1))}, Data: []byte("state at 20")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(10); err != nil {
		t.Fatal(err)
	}
}

// checkIntact checks that the log is exactly entries first..last as saveEach
// wrote them and that the hard state commits last.
func checkIntact(t testing.TB, s *Store, first, last uint64) {
	t.Helper()
	if got, err := s.FirstIndex(); err != nil || got != first {
		t.Fatalf("FirstIndex() = %d, %v; want %d", got, err, first)
	}
	if got, err := s.LastIndex(); err != nil || got != last {
		t.Fatalf("LastIndex() = %d, %v; want %d", got, err, last)
	}
	if last >= first {
		ents, err := s.Entries(first, last+1, ^uint64(0))
		if err != nil {
			t.Fatalf("Entries(%d, %d): %v", first, last+1, err)
		}
		for k, e := range ents {
			i := first + uint64(k)
			if e.GetIndex() != i || string(e.GetData()) != entryData(i) {
				t.Fatalf("entry %d = %v, want %q", i, e, entryData(i))
			}
		}
	}
	if hs, _, err := s.InitialState(); err != nil || hs.GetCommit() != last {
		t.Fatalf("hard state = %v, %v; want commit %d", hs, err, last)
	}
}

// walDir returns the live WAL directory of the store in dir.
func walDir(t testing.TB, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, metaName))
	if err != nil {
		t.Fatal(err)
	}
	m, err := decodeMeta(b)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, walDirName(m.walGen))
}

// segmentPaths returns the WAL segments of the store in dir, in order.
func segmentPaths(t testing.TB, dir string) []string {
	t.Helper()
	wd := walDir(t, dir)
	segs, err := listSegments(wd)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, sg := range segs {
		out = append(out, filepath.Join(wd, sg.name))
	}
	return out
}

// frame is one record of a segment as the tests see it.
type frame struct {
	off, end int64 // the frame, length field included: [off, end)
	typ      int64
	index    uint64 // entry index, for entry records
}

// frames decodes the frames of a segment up to the first zero length field.
func frames(t testing.TB, path string) []frame {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []frame
	for off := int64(0); off+8 <= int64(len(b)); {
		l := binary.LittleEndian.Uint64(b[off:])
		if l == 0 {
			break
		}
		n, pad := frameSize(l)
		end := off + 8 + int64(n+pad)
		rec := new(walpb.Record)
		if err := proto.Unmarshal(b[off+8:off+8+int64(n)], rec); err != nil {
			t.Fatalf("%s: frame at %d: %v", path, off, err)
		}
		f := frame{off: off, end: end, typ: rec.GetType()}
		if f.typ == wal.EntryType {
			e := new(raftpb.Entry)
			if err := proto.Unmarshal(rec.GetData(), e); err != nil {
				t.Fatal(err)
			}
			f.index = e.GetIndex()
		}
		out = append(out, f)
		off = end
	}
	return out
}

// entryFrame returns the frame of entry i in the segment.
func entryFrame(t testing.TB, path string, i uint64) frame {
	t.Helper()
	for _, f := range frames(t, path) {
		if f.typ == wal.EntryType && f.index == i {
			return f
		}
	}
	t.Fatalf("no record of entry %d in %s", i, path)
	return frame{}
}

// modify applies fn to the contents of the file at path.
func modify(t testing.TB, path string, fn func(b []byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, fn(b), 0o600); err != nil {
		t.Fatal(err)
	}
}

// flip flips a bit of the byte at off.
func flip(off int64) func(b []byte) []byte {
	return func(b []byte) []byte {
		b[off] ^= 0x10
		return b
	}
}

// zero zeroes [lo, hi).
func zero(lo, hi int64) func(b []byte) []byte {
	return func(b []byte) []byte {
		clear(b[lo:hi])
		return b
	}
}

func contains(err error, s string) bool {
	return err != nil && bytes.Contains([]byte(err.Error()), []byte(s))
}
