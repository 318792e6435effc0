package check

import (
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/verify/history"
)

// Review K: the two ways a lock's history can go unchecked must each fail
// the trial, not pass it silently.

// busyHistory is a legal history of n operations on lock "l": sessions
// take the lock in turn while reads of it overlap everything, so that
// porcupine has real work to do.
func busyHistory(n int) *hist {
	b := newHist()
	token := uint64(1000)
	for i := 0; len(b.h.Ops) < n; i++ {
		s := uint64(i%5 + 1)
		if i < 5 {
			b.session(s, 1<<40)
		}
		t0 := int64(i * 10)
		token++
		b.op(history.Acquire, s, history.OK, token, t0, t0+2)
		b.op(history.Release, s, history.OK, token, t0+5, t0+7)
		// Reads spanning the whole grant and release: either answer is fine.
		b.read(s, token, t0+1, t0+9, false)
		b.read(0, 0, t0+1, t0+9, false)
	}
	b.read(0, 0, int64(n*10), int64(n*10)+1, true)
	return b
}

// TestPorcupineTimeoutIsAViolation checks that porcupine running out of
// time (Options.Timeout) is reported as a linearizability violation: the
// same history passes with the default timeout.
func TestPorcupineTimeoutIsAViolation(t *testing.T) {
	b := busyHistory(1500)
	if r := Run(b.h, Options{}); r.Failed() {
		t.Fatalf("the history itself must pass: %v", r.Violations)
	}
	r := Run(b.h, Options{Timeout: time.Nanosecond})
	want(t, r.Fired(), Linearizable)
	if !strings.Contains(r.Violations[0].Msg, "no answer within") {
		t.Fatalf("violation %q, want a timeout", r.Violations[0])
	}
}

// TestTooLongLockHistoryIsAViolation checks the bound on a lock's history
// (Options.MaxOpsPerLock): a longer one is not checked and fails the trial.
func TestTooLongLockHistoryIsAViolation(t *testing.T) {
	b := busyHistory(40)
	if r := Run(b.h, Options{MaxOpsPerLock: 1000}); r.Failed() {
		t.Fatalf("the history itself must pass: %v", r.Violations)
	}
	r := Run(b.h, Options{MaxOpsPerLock: 20})
	want(t, r.Fired(), Linearizable)
	if !strings.Contains(r.Violations[0].Msg, "too many to check") {
		t.Fatalf("violation %q, want the size bound", r.Violations[0])
	}
}
