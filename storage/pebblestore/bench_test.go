package pebblestore

import (
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// benchmarkSave measures Save of n entries of 100 bytes each, synced, on the
// real file system (b.TempDir). ns/op is the latency of one Save, one fsync.
func benchmarkSave(b *testing.B, n int) {
	s, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	data := make([]byte, 100)
	for k := range data {
		data[k] = byte('a' + k%26)
	}
	term := uint64(1)
	next := uint64(1)
	ents := make([]*raftpb.Entry, n)
	b.SetBytes(int64(n * len(data)))
	b.ReportAllocs()
	for b.Loop() {
		for k := range ents {
			ents[k] = &raftpb.Entry{Index: new(next), Term: &term, Data: data}
			next++
		}
		if err := s.Save(nil, ents); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSave is one 100-byte entry per Save.
func BenchmarkSave(b *testing.B) { benchmarkSave(b, 1) }

// BenchmarkSaveBatch is 64 100-byte entries per Save.
func BenchmarkSaveBatch(b *testing.B) { benchmarkSave(b, 64) }

// BenchmarkOpen measures Open and Close of a store on the real file system
// whose newest WAL holds 1,000 entries of 100 bytes and is preallocated
// (prealloc.go): the restart of a replica's log store, with its check of
// the WAL's tail (walcheck.go).
func BenchmarkOpen(b *testing.B) {
	dir := b.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		b.Fatal(err)
	}
	term := uint64(1)
	data := make([]byte, 100)
	for i := uint64(1); i <= 1000; i++ {
		if err := s.Save(nil, []*raftpb.Entry{{Index: new(i), Term: &term, Data: data}}); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		s, err := Open(dir, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
