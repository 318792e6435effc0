package harness

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/verify/check"
)

// The self-test: the workload, nemesis, history and checkers run against
// the Fake lock service, correct and then broken by each Bug. A correct
// service must pass every checker; each broken one must be reported by the
// checkers listed for it, and every checker must catch at least one bug.
var expected = map[Bug][]string{
	DoubleGrant:  {check.Linearizable, check.Exclusion, check.Lease},
	TokenReuse:   {check.Linearizable, check.Exclusion, check.Tokens},
	LostAck:      {check.Linearizable, check.Final},
	EarlyExpiry:  {check.Linearizable, check.Lease},
	SlowFailover: {check.Availability},
}

// runFake runs a trial against the Fake with bug. A broken Fake's trial is
// meant to fail: its folder goes to the test's temporary directory, not
// with the artefacts of real failures, which are kept.
func runFake(t *testing.T, bug Bug, seed uint64) *Result {
	t.Helper()
	out := artefacts(t)
	if bug != NoBug {
		out = t.TempDir()
	}
	return Run(Options{
		Seed:   seed,
		Size:   3,
		TTL:    time.Second,
		Faults: []string{IsolateLeader, KillMinority},
		Steps:  3,
		Out:    out,
		System: func(_ string, rnd *rand.Rand) (System, error) {
			return NewFake(bug, time.Second, rnd), nil
		},
	})
}

func TestSelfTestCorrectFakePasses(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{1, 2} {
		res := runFake(t, NoBug, seed)
		report(t, res)
	}
}

func TestSelfTestCheckersCatchBugs(t *testing.T) {
	t.Parallel()
	caught := map[string]bool{}
	for _, bug := range Bugs {
		t.Run(string(bug), func(t *testing.T) {
			res := runFake(t, bug, 7)
			if res.Err != nil {
				t.Fatalf("the trial could not run: %v", res.Err)
			}
			fired := res.Report.Fired()
			t.Logf("%s: fired %v; %s", bug, fired, res.Report.Summary())
			for _, v := range res.Report.Violations[:min(len(res.Report.Violations), 3)] {
				t.Logf("  %v", v)
			}
			for _, c := range expected[bug] {
				if !slices.Contains(fired, c) {
					t.Errorf("%s was not reported by the %s checker (fired: %v)", bug, c, fired)
				}
			}
			for _, c := range fired {
				caught[c] = true
			}
		})
	}
	for _, c := range check.All {
		if !caught[c] {
			t.Errorf("the %s checker caught none of the bugs", c)
		}
	}
}
