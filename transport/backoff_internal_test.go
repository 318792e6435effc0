package transport

import (
	"testing"
	"time"
)

// A MaxReconnectWait below 2 ns passes validation (any positive value is
// taken as is) but makes backoff.next draw from an empty range: rand.N(0)
// panics, on a peer's sender goroutine, which kills the process at the
// first failed connection attempt. The wait must stay within (0, max].
func TestBackoffTinyMax(t *testing.T) {
	for _, max := range []time.Duration{1, 2, 3, time.Microsecond} {
		b := backoff{max: max}
		for range 3 {
			var d time.Duration
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("max %v: next panicked: %v", max, r)
					}
				}()
				d = b.next()
			}()
			if d < 0 || d > max {
				t.Fatalf("max %v: next = %v, want within [0, %v]", max, d, max)
			}
		}
	}
}
