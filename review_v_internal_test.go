package quorumlock

import (
	"testing"
	"time"
)

// An Acquire with a deadline waits at least 90% of the time it had: it
// stops waiting settleReserve before the deadline to settle its outcome,
// and that reserve is at most a tenth of the remaining time, whatever the
// election timeout (docs/architecture.md, Withdraw; invariant 12's
// table). It once kept min(election timeout, half the remaining time) and
// gave up after 1 s of a 2 s wait.
func TestReviewVSettleReserveKeepsNinetyPercent(t *testing.T) {
	for _, grace := range []time.Duration{time.Millisecond, 100 * time.Millisecond, time.Second, time.Minute} {
		for _, remaining := range []time.Duration{0, time.Millisecond, 50 * time.Millisecond, time.Second, 2 * time.Second, time.Hour} {
			r := settleReserve(grace, remaining)
			if r < 0 || r > remaining/10 || r > grace/4 {
				t.Errorf("settleReserve(grace %v, remaining %v) = %v, want at most min(%v, %v)", grace, remaining, r, grace/4, remaining/10)
			}
		}
	}
	if r := settleReserve(time.Second, 2*time.Second); r != 200*time.Millisecond {
		t.Errorf("settleReserve(1s, 2s) = %v, want 200ms (a 2 s wait keeps 1.8 s)", r)
	}
}
