package main

import (
	"math"
	"testing"
)

func TestSchedLatencyQuantile(t *testing.T) {
	before := schedLatency{buckets: []float64{0, 1e-6, 1e-5, 1e-4, math.Inf(1)}, counts: []uint64{5, 0, 0, 7}}
	after := schedLatency{buckets: before.buckets, counts: []uint64{15, 10, 0, 7}}
	d := after.since(before)
	if got := d.count(); got != 20 {
		t.Fatalf("count = %d, want 20", got)
	}
	for _, c := range []struct{ q, want float64 }{{0.25, 1e-6}, {0.5, 1e-6}, {0.51, 1e-5}, {1, 1e-5}} {
		if got := d.quantile(c.q); got != c.want {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	// The last bucket is open: its lower boundary stands for it.
	tail := schedLatency{buckets: before.buckets, counts: []uint64{0, 0, 0, 3}}
	if got := tail.quantile(0.5); got != 1e-4 {
		t.Errorf("open bucket quantile = %v, want 1e-4", got)
	}
	if got := readSchedLatency(); len(got.counts) == 0 || len(got.buckets) != len(got.counts)+1 {
		t.Errorf("runtime histogram: %d buckets, %d counts", len(got.buckets), len(got.counts))
	}
}
