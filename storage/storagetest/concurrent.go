package storagetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// testConcurrentReads reads the log from other goroutines while one goroutine
// saves, snapshots and compacts, as raft's goroutine and a status reader may.
// Every read must see a consistent log: entries that exist carry their
// expected content, and a range that was compacted meanwhile reports
// raft.ErrCompacted. Run it with -race.
func testConcurrentReads(t *testing.T, h *harness) {
	const total = 1500
	stop := make(chan struct{})
	errc := make(chan error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- readLoop(h.s, stop, r)
		}()
	}

	var werr error
	for lo := uint64(1); lo <= total && werr == nil; lo += 50 {
		if werr = h.s.Save(hardState(1, 1, lo-1), entries(lo, lo+49, 1)); werr != nil {
			break
		}
		if last := lo + 49; last%200 == 0 {
			if werr = h.s.SaveSnapshot(snapshot(last-10, 1, []uint64{1}, fmt.Sprintf("state at %d", last-10))); werr != nil {
				break
			}
			werr = h.s.Compact(last - 60)
		}
	}
	close(stop)
	wg.Wait()
	close(errc)
	if werr != nil {
		t.Fatalf("writer: %v", werr)
	}
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// readLoop reads until stop is closed and returns the first inconsistency.
func readLoop(s interface {
	FirstIndex() (uint64, error)
	LastIndex() (uint64, error)
	Term(uint64) (uint64, error)
	Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error)
}, stop <-chan struct{}, seed int) error {
	for k := seed; ; k++ {
		select {
		case <-stop:
			return nil
		default:
		}
		first, err := s.FirstIndex()
		if err != nil {
			return fmt.Errorf("FirstIndex: %w", err)
		}
		last, err := s.LastIndex()
		if err != nil {
			return fmt.Errorf("LastIndex: %w", err)
		}
		if last < first {
			continue
		}
		lo := first + uint64(k*7)%(last-first+1)
		hi := min(last+1, lo+20)
		ents, err := s.Entries(lo, hi, noLimit)
		if errors.Is(err, raft.ErrCompacted) {
			continue
		}
		if err != nil {
			return fmt.Errorf("Entries(%d, %d): %w", lo, hi, err)
		}
		if len(ents) != int(hi-lo) {
			return fmt.Errorf("Entries(%d, %d) returned %s", lo, hi, describe(ents))
		}
		for j, e := range ents {
			if want := entry(lo+uint64(j), 1); e.GetIndex() != want.GetIndex() || string(e.GetData()) != string(want.GetData()) {
				return fmt.Errorf("Entries(%d, %d)[%d] = %v, want %v", lo, hi, j, e, want)
			}
		}
		if term, err := s.Term(lo); err != nil && !errors.Is(err, raft.ErrCompacted) {
			return fmt.Errorf("Term(%d): %w", lo, err)
		} else if err == nil && term != 1 {
			return fmt.Errorf("Term(%d) = %d, want 1", lo, term)
		}
	}
}
