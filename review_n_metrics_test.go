package quorumlock_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// TestReviewNUnknownOpsShareOneMetricLabel: a client (or anything that
// reaches the port) sending requests with ops the protocol does not name
// gets CODE_INVALID, and every such request counts under op="unknown".
// Before, each distinct value made a new label set of
// quorumlock_requests_total and of the 16-bucket
// quorumlock_request_seconds, kept for the leader's lifetime: 2,000
// values, 2,000 series each.
func TestReviewNUnknownOpsShareOneMetricLabel(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := testcluster.New(t, testcluster.Options{Configure: func(cfg *quorumlock.Config) { cfg.Metrics = reg }})
	lead := c.WaitLeader(10 * time.Second)
	lc := dialLeader(t, c.Node(lead))
	const ops = 2000
	for i := range ops {
		op := lockpb.Op(100 + i)
		if i%2 == 1 {
			op = lockpb.Op(-100 - i)
		}
		r, err := lc.Propose(testCtx(t, 5*time.Second), &lockpb.Request{Op: op, Name: "x"})
		if err != nil || r.GetCode() != lockpb.Code_CODE_INVALID {
			t.Fatalf("op %d: %v, %v; want CODE_INVALID", op, r, err)
		}
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	leader := strconv.FormatUint(lead, 10)
	for _, f := range fams {
		if f.GetName() != "quorumlock_requests_total" && f.GetName() != "quorumlock_request_seconds" {
			continue
		}
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" {
					labels[l.GetValue()] = true
				}
			}
		}
		if len(labels) > len(lockpb.Op_name)+1 {
			t.Errorf("%s: %d op labels after %d unknown ops, want at most %d", f.GetName(), len(labels), ops, len(lockpb.Op_name)+1)
		}
	}
	if v, _ := metricValue(t, reg, "quorumlock_requests_total", map[string]string{"member": leader, "op": "unknown", "code": "invalid"}); v != ops {
		t.Errorf("requests counted under op=unknown: %v, want %d", v, ops)
	}
}
