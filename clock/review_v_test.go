package clock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/clock"
)

// A Manual clock never reads earlier than it did (Advance "moves the clock
// forward"; the package stands in for the monotonic clock). Timers armed
// in the past (d <= 0, as a lease timer whose deadline has passed) fire at
// the next Advance; Advance used to set the reading to each such timer's
// due time while it fired them, so a timer's f, or any goroutine reading
// Now meanwhile, saw the clock go back by up to the timers' lateness. Many
// past timers keep Advance firing long enough for the first f to read Now
// before it ends.
func TestReviewVManualNeverGoesBack(t *testing.T) {
	start := time.Unix(1000, 0)
	m := clock.NewManual(start)
	const timers = 2000
	var mu sync.Mutex
	var wg sync.WaitGroup
	earliest := start
	wg.Add(timers)
	for i := range timers {
		m.AfterFunc(-time.Duration(timers-i)*time.Millisecond, func() {
			defer wg.Done()
			now := m.Now()
			mu.Lock()
			if now.Before(earliest) {
				earliest = now
			}
			mu.Unlock()
		})
	}
	m.Advance(0)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the past timers did not all fire")
	}
	if earliest.Before(start) {
		t.Fatalf("a timer's f read %v, %v before the clock's reading when Advance began", earliest, start.Sub(earliest))
	}
	if got := m.Now(); !got.Equal(start) {
		t.Fatalf("Now after Advance(0) = %v, want %v", got, start)
	}
}
