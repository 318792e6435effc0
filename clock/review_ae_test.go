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

// The same from concurrent Advances (Clock: "Implementations are safe
// for concurrent use"): Advance lets go of the clock while it starts a
// timer's f, and an Advance that began earlier and ended later set the
// reading back to its own target, behind the other's. A reader of Now
// never sees it go back. (Without the fix this failed on every run here:
// 2,000 timers give the Advances many such windows.)
func TestReviewAEManualConcurrentAdvanceNeverGoesBack(t *testing.T) {
	m := clock.NewManual(time.Unix(1000, 0))
	for i := range 2000 {
		m.AfterFunc(time.Duration(i)*time.Millisecond, func() {})
	}
	stop := make(chan struct{})
	went := make(chan string, 1)
	go func() {
		defer close(went)
		last := m.Now()
		for {
			select {
			case <-stop:
				return
			default:
			}
			now := m.Now()
			if now.Before(last) {
				went <- now.String() + " after " + last.String()
				return
			}
			last = now
		}
	}()
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 500 {
				m.Advance(time.Millisecond)
			}
		}()
	}
	deadline := time.After(10 * time.Second)
	for range 4 {
		select {
		case <-done:
		case <-deadline:
			t.Fatal("the Advances did not finish within 10 s")
		}
	}
	close(stop)
	if msg, ok := <-went; ok {
		t.Fatalf("Now went back: %s", msg)
	}
}
