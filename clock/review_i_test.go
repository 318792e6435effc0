package clock_test

import (
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/clock"
)

// Manual.NewTicker with a period of 0 or less panics at the call, as
// time.NewTicker does (Clock.NewTicker documents d > 0). It used to return
// a ticker whose first Advance crashed the process with the unrecoverable
// "go of nil func value", far from the mistake.
func TestReviewIManualTickerNonPositivePanicsAtCall(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		m := clock.NewManual(time.Unix(0, 0))
		func() {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), "non-positive interval") {
					t.Errorf("NewTicker(%v): recovered %v, want a panic naming the non-positive interval", d, r)
				}
			}()
			m.NewTicker(d)
		}()
		if n := m.Pending(); n != 0 {
			t.Errorf("NewTicker(%v) left %d waiters armed", d, n)
		}
	}
}

// Advance starts each due AfterFunc in its own goroutine, in time order,
// and does not wait for them; Stop of a timer that already fired reports
// false, a timer due exactly at the new time fires, and one with d <= 0
// fires at the next Advance, even Advance(0).
func TestReviewIManualTimers(t *testing.T) {
	m := clock.NewManual(time.Unix(0, 0))
	fired := make(chan int, 2)
	tm := m.AfterFunc(time.Second, func() { fired <- 1 })
	m.Advance(time.Second)
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("timer due at the new time did not fire")
	}
	if tm.Stop() {
		t.Error("Stop after the timer fired reported true")
	}
	tm2 := m.AfterFunc(time.Second, func() { fired <- 2 })
	if !tm2.Stop() {
		t.Error("Stop of a pending timer reported false")
	}
	m.Advance(time.Hour)
	select {
	case <-fired:
		t.Error("a stopped timer fired")
	case <-time.After(50 * time.Millisecond):
	}
	m.AfterFunc(-time.Second, func() { fired <- 3 })
	m.Advance(0)
	select {
	case v := <-fired:
		if v != 3 {
			t.Errorf("fired %d, want the timer of d < 0", v)
		}
	case <-time.After(5 * time.Second):
		t.Error("a timer with d < 0 did not fire at Advance(0)")
	}
}
