package storage_test

import (
	"slices"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/storage"
	"github.com/quorumlock/quorumlock/storage/pebblestore"
	"github.com/quorumlock/quorumlock/storage/walstore"
)

// BenchmarkSave compares the backends side by side: the latency of one Save
// of one ~100-byte entry with a hard state committing it, the write a
// replica makes for an uncontended lock request. Each Save is one fsync on
// the real file system (b.TempDir), so the numbers are the disk's. It
// reports the median and 99th percentile latency besides the mean (ns/op).
//
//	go test -bench Save -run '^$' ./storage/...
func BenchmarkSave(b *testing.B) {
	for _, backend := range []struct {
		name string
		open func(dir string) (storage.LogStore, error)
	}{
		{"pebble", func(dir string) (storage.LogStore, error) { return pebblestore.Open(dir, pebblestore.Options{}) }},
		{"wal", func(dir string) (storage.LogStore, error) { return walstore.Open(dir, walstore.Options{}) }},
	} {
		b.Run(backend.name, func(b *testing.B) {
			s, err := backend.open(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = s.Close() }()
			data := make([]byte, 100)
			for k := range data {
				data[k] = byte('a' + k%26)
			}
			term := uint64(1)
			lat := make([]time.Duration, 0, 4096)
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for i := uint64(1); b.Loop(); i++ {
				hs := &raftpb.HardState{Term: &term, Vote: new(uint64(1)), Commit: new(i)}
				ents := []*raftpb.Entry{{Index: new(i), Term: &term, Data: data}}
				start := time.Now()
				if err := s.Save(hs, ents); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3 }
			b.ReportMetric(pct(0.50), "p50-µs")
			b.ReportMetric(pct(0.99), "p99-µs")
		})
	}
}
