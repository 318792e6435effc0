package main

import (
	"strings"
	"testing"

	"github.com/quorumlock/quorumlock/internal/proctest"
)

// observe of a role the cluster refuses (empty, or longer than its
// MaxNameBytes) exits 1 naming the invalid name, as leader does: it said
// only "observe stream ended".
func TestReviewUObserveInvalidRoleSaysWhy(t *testing.T) {
	c := newCluster(t, proctest.Options{})
	lc := newCtl(t, c)
	for _, role := range []string{"", strings.Repeat("r", 300)} {
		_, errs, code := lc.run("observe", role)
		if code != 1 || !strings.Contains(errs, "invalid lock name") {
			t.Errorf("lockctl observe (%d-byte role): exit %d, stderr %q; want exit 1 naming the invalid name", len(role), code, errs)
		}
	}
}
