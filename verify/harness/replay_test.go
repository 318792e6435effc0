package harness

import (
	"flag"
	"reflect"
	"strings"
	"testing"
	"time"
)

// replayed parses a replay command the way the verify command reads its
// flags (verify/main.go) and returns the options it runs the trial with.
func replayed(t *testing.T, cmd string) Options {
	t.Helper()
	_, args, ok := strings.Cut(cmd, "go run ./verify ")
	if !ok {
		t.Fatalf("not a verify command: %q", cmd)
	}
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.Int("trials", 10, "")
	seed := fs.Uint64("seed", 0, "")
	faults := fs.String("faults", "", "")
	replicas := fs.Int("replicas", 0, "")
	steps := fs.Int("steps", 0, "")
	margin := fs.Duration("margin", 0, "")
	if err := fs.Parse(strings.Fields(args)); err != nil {
		t.Fatalf("%q: %v", cmd, err)
	}
	var kinds []string
	if *faults != "" {
		kinds = strings.Split(*faults, ",")
	}
	return Options{Seed: *seed, Size: *replicas, Faults: kinds, Steps: *steps, Margin: *margin}
}

// The same seed replays the same fault schedule: the replay command that a
// failed trial writes to seed.txt runs a trial with the same cluster size,
// TTL, availability bound and plan, whichever options the first run was
// given (as the CI tests and the command give them).
func TestReplayCommandReplaysThePlan(t *testing.T) {
	for _, opts := range []Options{
		{Seed: 1},    // TestRandomizedTrials, go run ./verify
		{Seed: 4243}, // another draw
		{Seed: 1006, Size: 3, Faults: []string{LeaderChurn}, Steps: 2},              // TestFaultScenarios
		{Seed: 1004, Size: 5, Faults: []string{KillMinority}, Steps: 2},             // TestFaultScenarios, 5 replicas
		{Seed: 77, Faults: []string{Partition, DelayDrop}, Margin: 2 * time.Second}, // go run ./verify -faults ... -margin 2s
		{Seed: 78, Size: 5, Steps: 4},
	} {
		first, plan := draw(opts)
		again, plan2 := draw(opts)
		if !reflect.DeepEqual(plan, plan2) || first.Size != again.Size || first.TTL != again.TTL {
			t.Fatalf("seed %d: two draws differ: %v / %v", opts.Seed, plan, plan2)
		}
		cmd := replayCommand(opts)
		replay, replan := draw(replayed(t, cmd))
		if !reflect.DeepEqual(plan, replan) {
			t.Errorf("%q: plan %v, replayed %v", cmd, plan, replan)
		}
		if replay.Size != first.Size || replay.TTL != first.TTL || replay.Margin != first.Margin || !reflect.DeepEqual(replay.Faults, first.Faults) {
			t.Errorf("%q: %d replicas, TTL %v, margin %v, faults %v; replayed %d, %v, %v, %v", cmd,
				first.Size, first.TTL, first.Margin, first.Faults, replay.Size, replay.TTL, replay.Margin, replay.Faults)
		}
	}
}
