//go:build linux && (amd64 || arm64)

package pebblestore

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/metrics"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
)

// TestOffCPUSyncer: a sync of a regular file goes through AIO and succeeds
// without the fallback; a descriptor the kernel refuses (a pipe) gets the
// fallback's result, then the fallback directly; after close too.
func TestOffCPUSyncer(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "wal"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("record")); err != nil {
		t.Fatal(err)
	}
	s, err := newOffCPUSyncer(f.Fd())
	if err != nil {
		t.Fatalf("newOffCPUSyncer on %s: %v", f.Name(), err)
	}
	fallbacks := 0
	errFallback := errors.New("fallback")
	fallback := func() error { fallbacks++; return errFallback }
	for i := range 3 {
		if err := s.syncData(fallback); err != nil || fallbacks != 0 {
			t.Fatalf("sync %d of a regular file: %v, %d fallbacks", i, err, fallbacks)
		}
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if err := s.close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := s.syncData(fallback); !errors.Is(err, errFallback) || fallbacks != 1 {
		t.Fatalf("sync after close: %v, %d fallbacks; want the fallback's result", err, fallbacks)
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	ps, err := newOffCPUSyncer(w.Fd())
	if err != nil {
		t.Fatal(err)
	}
	defer ps.close()
	fallbacks = 0
	if err := ps.syncData(fallback); !errors.Is(err, errFallback) || fallbacks != 1 {
		t.Fatalf("sync of a pipe: %v, %d fallbacks; want the fallback's result once", err, fallbacks)
	}
	if !ps.(*aioSyncer).disabled {
		t.Fatal("a refused request did not switch the syncer to its fallback")
	}
	if err := ps.syncData(fallback); !errors.Is(err, errFallback) || fallbacks != 2 {
		t.Fatalf("second sync of a pipe: %v, %d fallbacks", err, fallbacks)
	}
}

// TestWALSyncsOffCPU: under scheduling pressure the WAL's syncs wait off
// the processor, and what they synced is all there after a crash image,
// a WAL rotation and a reopen.
func TestWALSyncsOffCPU(t *testing.T) {
	dir := t.TempDir()
	s := openT(t, dir, Options{Logger: zap.NewNop()}, defaultCacheLimits)
	defer s.Close()
	if s.pressure == nil {
		t.Fatal("a store on the operating system's file system has no schedPressure")
	}
	f := newFakeSchedLatency()
	s.pressure.setSample(func() *metrics.Float64Histogram {
		f.add(4, 100) // every read sees a window of 1 ms waits
		return f.sample()
	})
	hs := func(commit uint64) *raftpb.HardState {
		return &raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(1)), Commit: new(commit)}
	}
	save := func(lo, hi uint64) {
		for i := lo; i <= hi; i++ {
			if err := s.Save(hs(i-1), testEntries(i, i, 1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(dir string, last uint64) {
		t.Helper()
		r := openT(t, dir, Options{Logger: zap.NewNop()}, defaultCacheLimits)
		defer r.Close()
		ents, err := r.Entries(1, last+1, math.MaxUint64)
		if err != nil || len(ents) != int(last) {
			t.Fatalf("reopened %s: %d entries, %v; want %d", dir, len(ents), err, last)
		}
		for i, e := range ents {
			if want := fmt.Sprintf("entry %d", i+1); e.GetIndex() != uint64(i+1) || string(e.GetData()) != want {
				t.Fatalf("reopened: entry %d is %v", i+1, e)
			}
		}
	}
	save(1, 100)
	if n := s.pressure.offCPU.Load(); n < 50 {
		t.Fatalf("%d of 100 synced Saves waited off the processor under pressure (blocked: %d)", n, s.pressure.blocked.Load())
	}
	check(crashImage(t, dir), 100)

	if err := s.db.Flush(); err != nil { // a new WAL, created under pressure
		t.Fatal(err)
	}
	before := s.pressure.offCPU.Load()
	save(101, 150)
	if s.pressure.offCPU.Load()-before < 50 {
		t.Fatalf("after a WAL rotation only %d of 50 syncs waited off the processor", s.pressure.offCPU.Load()-before)
	}
	check(crashImage(t, dir), 150)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check(dir, 150)
}
