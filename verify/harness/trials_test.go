package harness

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/verify/check"
)

var (
	randomTrials = flag.Int("verify.trials", 20, "randomized trials in TestRandomizedTrials (-short: 4)")
	firstSeed    = flag.Uint64("verify.seed", 1, "seed of the first randomized trial")
)

// artefacts is where failed trials leave their folders.
func artefacts(t *testing.T) string {
	dir := os.Getenv("VERIFY_OUT")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "quorumlock-verify")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func report(t *testing.T, res *Result) {
	t.Helper()
	t.Log(res.Summary())
	if res.Report != nil {
		for _, v := range res.Report.Violations {
			t.Errorf("seed %d: %v", res.Seed, v)
		}
	}
	if res.Err != nil {
		t.Errorf("seed %d: the trial could not run: %v", res.Seed, res.Err)
	}
	if res.Failed() {
		t.Errorf("seed %d: artefacts in %s (seed.txt has the replay command)", res.Seed, res.Dir)
	}
}

// TestFaultScenarios runs one trial per fault kind: the same fault twice,
// on a 3-replica cluster and, for the faults that need room, a 5-replica
// one.
func TestFaultScenarios(t *testing.T) {
	out := artefacts(t)
	for i, kind := range FaultKinds {
		t.Run(kind, func(t *testing.T) {
			size := 3
			if kind == KillMinority || kind == Partition {
				size = 5
			}
			report(t, Run(Options{Seed: 1000 + uint64(i), Size: size, Faults: []string{kind}, Steps: 2, Out: out}))
		})
	}
}

// TestRandomizedTrials runs randomized trials: 3 or 5 replicas, 2 to 4
// faults of any kind, seeds verify.seed, verify.seed+1, ...
func TestRandomizedTrials(t *testing.T) {
	n := *randomTrials
	if testing.Short() {
		n = min(n, 4)
	}
	out := artefacts(t)
	var recoveries []time.Duration
	ops := 0
	for i := range n {
		seed := *firstSeed + uint64(i)
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			res := Run(Options{Seed: seed, Out: out})
			report(t, res)
			if res.Report != nil {
				recoveries = append(recoveries, res.Report.Recoveries...)
				ops += res.Report.Ops
			}
		})
	}
	p50 := check.Percentile(recoveries, 50)
	t.Logf("%d trials, %d operations checked; recovery after a leader loss: %d measured, p50 %v, max %v",
		n, ops, len(recoveries), p50, check.Percentile(recoveries, 100))
	if bound := RecoveryP50Bound * 100 * time.Millisecond; len(recoveries) >= 10 && p50 > bound {
		t.Errorf("median recovery after a leader loss is %v, above %d election timeouts (%v)", p50, RecoveryP50Bound, bound)
	}
}
