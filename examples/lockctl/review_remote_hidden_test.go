package main

import (
	"strings"
	"testing"
)

// -limit of locks and sessions below 1 is a usage error (exit 2): it was
// passed to Client.Locks/Sessions, which take 0 or less as their default
// page of 100, so "-limit -1" or "-limit 0" quietly listed 100 entries.
func TestReviewRemoteLimitBelowOneIsUsage(t *testing.T) {
	lc := &ctl{t: t, flags: []string{"-endpoints", "127.0.0.1:1", "-timeout", "500ms"}}
	for _, args := range [][]string{{"locks", "-limit", "0"}, {"locks", "-limit", "-1"}, {"sessions", "-limit", "0"}, {"sessions", "-all", "-limit", "-5"}} {
		if _, errs, code := lc.run(args...); code != 2 || !strings.Contains(errs, "-limit") {
			t.Errorf("lockctl %q: exit %d, stderr %q; want exit 2 naming -limit", args, code, errs)
		}
	}
}
