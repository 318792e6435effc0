package clock_test

import (
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/clock"
)

// Review AE: promises of the clock package's docstrings that no test
// checked.

// Advance "moves the clock forward by d": a negative d must not set the
// reading back (the Manual clock stands in for the monotonic clock, whose
// readings never decrease). It used to set Now to the earlier time, so a
// lease deadline already reached was reached no longer. A negative d
// fires what is due now, as Advance(0) does.
func TestReviewAEManualAdvanceNegativeKeepsTime(t *testing.T) {
	start := time.Unix(1000, 0)
	m := clock.NewManual(start)
	fired := make(chan struct{})
	m.AfterFunc(0, func() { close(fired) })
	m.Advance(-time.Hour)
	if got := m.Now(); !got.Equal(start) {
		t.Fatalf("Now after Advance(-1h) = %v, want %v (the clock never goes back)", got, start)
	}
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("a timer due now did not fire at Advance(-1h)")
	}
	// A ticker armed before stays on its schedule.
	tk := m.NewTicker(time.Second)
	defer tk.Stop()
	m.Advance(-time.Minute)
	m.Advance(time.Second)
	select {
	case got := <-tk.C():
		if want := start.Add(time.Second); !got.Equal(want) {
			t.Fatalf("tick at %v, want %v", got, want)
		}
	default:
		t.Fatal("no tick one period after the ticker was made")
	}
}

// "Ticker delivers ticks on C until stopped", like time.Ticker, which
// since Go 1.23 delivers no tick after Stop returns, not even one prepared
// before the call. Manual's ticker kept a tick it had buffered for a slow
// receiver, so C still delivered one after Stop.
func TestReviewAEManualTickerStopDeliversNothingLater(t *testing.T) {
	m := clock.NewManual(time.Unix(1000, 0))
	tk := m.NewTicker(time.Second)
	m.Advance(time.Second) // a tick is ready, not taken
	tk.Stop()
	select {
	case got := <-tk.C():
		t.Fatalf("tick %v received after Stop", got)
	default:
	}
	// The real ticker agrees (the behaviour Manual copies).
	rt := clock.Real().NewTicker(time.Millisecond)
	time.Sleep(5 * time.Millisecond)
	rt.Stop()
	select {
	case got := <-rt.C():
		t.Fatalf("real ticker: tick %v received after Stop", got)
	default:
	}
}
