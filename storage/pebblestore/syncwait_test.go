package pebblestore

import (
	"runtime/metrics"
	"slices"
	"testing"
)

// fakeSchedLatency is a cumulative scheduling-latency histogram that a test
// grows window by window.
type fakeSchedLatency struct {
	h metrics.Float64Histogram
}

func newFakeSchedLatency() *fakeSchedLatency {
	return &fakeSchedLatency{h: metrics.Float64Histogram{
		// Buckets: [0,10us) [10us,100us) [100us,300us) [300us,1ms) [1ms,+Inf)
		Counts:  make([]uint64, 5),
		Buckets: []float64{0, 10e-6, 100e-6, 300e-6, 1e-3, 1e9},
	}}
}

// add records n scheduling events in bucket i.
func (f *fakeSchedLatency) add(i int, n uint64) { f.h.Counts[i] += n }

func (f *fakeSchedLatency) sample() *metrics.Float64Histogram {
	c := f.h
	c.Counts = slices.Clone(f.h.Counts)
	return &c
}

// TestSchedPressure: the state changes only when the histogram is read
// (every pressureEvery syncs), turns on at a window p90 of pressureOn or
// more, off below pressureOff or on a window with too few events, and
// stays put in between.
func TestSchedPressure(t *testing.T) {
	f := newFakeSchedLatency()
	p := newSchedPressure()
	p.setSample(f.sample)
	// window ends one window: pressureEvery calls, of which only the last
	// reads the histogram; it checks that the earlier ones keep the state.
	window := func(want bool, what string) {
		t.Helper()
		before := p.high()
		for range pressureEvery - 2 {
			if got := p.high(); got != before {
				t.Fatalf("%s: state changed from %v between two reads", what, before)
			}
		}
		if got := p.high(); got != want {
			t.Fatalf("%s: high() = %v, want %v", what, got, want)
		}
	}
	window(false, "first read (no previous histogram)")

	f.add(0, 90)
	f.add(1, 10)
	window(false, "p90 below 10 us")

	f.add(0, 50)
	f.add(3, 50)
	window(true, "p90 at 300 us")

	f.add(2, 100)
	window(true, "p90 at 100 us, between off and on: stays on")

	f.add(3, pressureMinSamples-1)
	window(false, "a window with too few events (a quiet process): off")

	f.add(3, 100)
	window(true, "p90 at 300 us again")

	f.add(1, 100)
	window(false, "p90 at 10 us: off")

	f.add(2, 100)
	window(false, "p90 at 100 us, between off and on: stays off")

	f.add(4, 10)
	f.add(0, 80)
	window(true, "p90 in the 1 ms bucket (10 of 90 events)")
}
