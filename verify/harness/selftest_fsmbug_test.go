//go:build fsmbug

package harness

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/verify/check"
)

// fsmExpected lists the checkers that must report each bug of the broken
// state machine (internal/fsm/bug_on.go). A double grant is not always
// seen by mutual-exclusion: the Fence rejects the older holder's writes
// once the newer grant wrote, so only an accepted write of the older
// holder overlapping one of the newer shows it (4 of 5 runs).
var fsmExpected = map[string][]string{
	"double-grant": {check.Linearizable, check.Lease},
	"token-reuse":  {check.Linearizable, check.Tokens},
}

// TestSelfTestBrokenStateMachine runs a trial on a real cluster whose
// state machine is broken on purpose (go test -tags fsmbug): the checkers
// must report the bug, and the failed trial must leave its artefacts
// (seed, schedule, history JSON, porcupine's HTML, violations).
func TestSelfTestBrokenStateMachine(t *testing.T) {
	for _, bug := range fsm.Bugs {
		t.Run(bug, func(t *testing.T) {
			if err := fsm.SetBug(bug); err != nil {
				t.Fatal(err)
			}
			defer fsm.SetBug("")
			res := Run(Options{Seed: 21, Size: 3, Faults: []string{DelayDrop}, Steps: 1, Out: t.TempDir()})
			if res.Report == nil {
				t.Fatalf("no report: %v", res.Err)
			}
			fired := res.Report.Fired()
			t.Logf("%s: fired %v; %s", bug, fired, res.Report.Summary())
			for _, c := range fsmExpected[bug] {
				if !slices.Contains(fired, c) {
					t.Errorf("%s was not reported by the %s checker (fired: %v)", bug, c, fired)
				}
			}
			if res.Dir == "" {
				t.Fatal("the failed trial saved no artefacts")
			}
			for _, pattern := range []string{"seed.txt", "schedule.txt", "history.json", "violations.txt", "linearizability-*.html", "raftlog.txt"} {
				m, _ := filepath.Glob(filepath.Join(res.Dir, pattern))
				if len(m) == 0 {
					t.Errorf("%s: no %s", res.Dir, pattern)
					continue
				}
				if fi, err := os.Stat(m[0]); err != nil || fi.Size() == 0 {
					t.Errorf("%s is empty or unreadable: %v", m[0], err)
				}
			}
		})
	}
}
