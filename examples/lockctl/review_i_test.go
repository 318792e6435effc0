package main

import (
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/proctest"
)

// status against a subset of the replicas that leaves the leader out (the
// README: "Any subset of the replicas' addresses works") exits 0 when the
// followers asked name a leader: it exited 1 with "no replica reports a
// leader" while every row showed the leader's ID.
func TestReviewIStatusLeaderNotAmongEndpoints(t *testing.T) {
	c := newCluster(t, proctest.Options{})
	leader := c.WaitLeader(10 * time.Second)
	var follower uint64
	for _, id := range c.IDs() {
		if id != leader {
			follower = id
			break
		}
	}
	lc := newCtl(t, c)
	lc.flags = append(lc.flags, "-endpoints", c.Addr(follower))
	out, errs, code := lc.run("status")
	if code != 0 {
		t.Fatalf("status asking follower %d only: exit %d\nstdout:\n%s\nstderr:\n%s", follower, code, out, errs)
	}
	if strings.Contains(out, "*") {
		t.Errorf("status marked a leader among rows that hold none:\n%s", out)
	}
}

// A session ID that is not a positive integer is a usage error (exit 2 with
// the usage), as a malformed -token or -after is; it exited 1.
func TestReviewIRevokeSessionBadIDIsUsage(t *testing.T) {
	lc := &ctl{t: t, flags: []string{"-endpoints", "127.0.0.1:1", "-timeout", "500ms"}}
	for _, id := range []string{"x", "0", "1.5"} {
		if _, errs, code := lc.run("revoke-session", id); code != 2 || !strings.Contains(errs, "usage") || !strings.Contains(errs, "positive integer") {
			t.Errorf("revoke-session %q: exit %d, stderr %q", id, code, errs)
		}
	}
}
