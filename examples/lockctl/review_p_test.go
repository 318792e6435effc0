package main

import (
	"strings"
	"testing"
)

// Review P: each command's argument count is checked before anything is
// dialled: a missing or extra argument is a usage error (exit 2 with the
// usage), not a failure to reach the cluster (exit 1).
func TestReviewPArgumentCountIsUsage(t *testing.T) {
	lc := &ctl{t: t, flags: []string{"-endpoints", "127.0.0.1:1", "-timeout", "500ms"}}
	for _, args := range [][]string{
		{"status", "extra"}, {"sessions", "extra"},
		{"leader"}, {"leader", "a", "b"},
		{"observe"}, {"observe", "a", "b"},
		{"revoke-session", "1", "2"},
	} {
		if _, errs, code := lc.run(args...); code != 2 || !strings.Contains(errs, "usage") {
			t.Errorf("lockctl %q: exit %d, stderr %q; want exit 2 with the usage", args, code, errs)
		}
	}
}
