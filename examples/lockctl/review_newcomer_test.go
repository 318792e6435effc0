package main

import (
	"strings"
	"testing"
)

// An acquire -ttl outside the session TTL range is a usage error (exit 2),
// as a negative -wait or -kill-grace is, found before any replica is
// asked: it exited 1, after dialing, like an unreachable cluster (and,
// with a cluster, only once NewSession refused the TTL).
func TestReviewNewcomerAcquireTTLIsUsage(t *testing.T) {
	lc := &ctl{t: t, flags: []string{"-endpoints", "127.0.0.1:1", "-timeout", "500ms"}}
	for _, ttl := range []string{"0s", "-1s", "999ms", "11m"} {
		if _, errs, code := lc.run("acquire", "-ttl", ttl, "x", "true"); code != 2 || !strings.Contains(errs, "usage") || !strings.Contains(errs, "-ttl") {
			t.Errorf("lockctl acquire -ttl %s: exit %d, stderr %q", ttl, code, errs)
		}
	}
}
