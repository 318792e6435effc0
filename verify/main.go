// Command verify runs randomized fault-injection trials against an
// in-process quorumlock cluster and checks each history: linearizability
// (porcupine), mutual exclusion at a fenced resource, fencing tokens, the
// final lock table, session leases and availability after a leader loss.
// See doc.go in verify/harness and verify/README.md.
//
//	go run ./verify -trials 20 -seed 1 -out /tmp/verify
//
// Trial i uses seed S+i; a failing trial prints the folder holding its
// seed, fault schedule, history (JSON) and porcupine visualization, and
// `go run ./verify -trials 1 -seed X` replays its fault schedule. With
// -procs the replicas are separate lockd processes (real SIGKILL, SIGTERM
// and SIGSTOP/SIGCONT, no network faults).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/quorumlock/quorumlock/internal/proctest"
	"github.com/quorumlock/quorumlock/verify/check"
	"github.com/quorumlock/quorumlock/verify/harness"
)

func main() {
	trials := flag.Int("trials", 10, "number of trials")
	seed := flag.Uint64("seed", uint64(time.Now().UnixNano()), "seed of the first trial (trial i uses seed+i)")
	out := flag.String("out", "", "folder for the artefacts of failed trials (default: the temp directory)")
	faults := flag.String("faults", "", "comma-separated fault kinds to draw from (default: all: "+strings.Join(harness.FaultKinds, ",")+"; also, only when named: "+strings.Join(harness.ExtraFaultKinds, ",")+")")
	replicas := flag.Int("replicas", 0, "replicas per cluster, 3 or 5 (default: drawn per trial)")
	steps := flag.Int("steps", 0, "faults per trial (default: 2 to 4, drawn per trial)")
	keep := flag.Bool("keep", false, "save the artefacts of passing trials too")
	margin := flag.Duration("margin", 0, "availability bound = 2 x election timeout + margin (default: 5 election timeouts)")
	verbose := flag.Bool("v", false, "log progress")
	procs := flag.Bool("procs", false, "run separate lockd processes (SIGKILL, SIGTERM, SIGSTOP/SIGCONT) instead of an in-process cluster; faults: "+strings.Join(harness.ProcFaults, ","))
	flag.Parse()

	var kinds []string
	if *faults != "" {
		kinds = strings.Split(*faults, ",")
	}
	if *out != "" {
		if err := os.MkdirAll(*out, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	var lockd, binDir string
	if *procs {
		var err error
		if binDir, err = os.MkdirTemp("", "verify-lockd-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		bins, err := proctest.BuildTags(binDir, "crashpoint", harness.LockdPackage)
		if err != nil {
			os.RemoveAll(binDir)
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		lockd = bins[harness.LockdPackage]
	}
	var logf func(string)
	if *verbose {
		logf = func(s string) { fmt.Fprintln(os.Stderr, s) }
	}
	failed, errored, ops := 0, 0, 0
	var recoveries, checkTimes []time.Duration
	start := time.Now()
	for i := range *trials {
		res := harness.Run(harness.Options{
			Seed: *seed + uint64(i), Size: *replicas, Faults: kinds, Steps: *steps,
			Out: *out, Keep: *keep, Log: logf, Margin: *margin, Procs: lockd,
		})
		fmt.Println(res.Summary())
		if res.Report != nil {
			for _, v := range res.Report.Violations {
				fmt.Println("  ", v)
			}
			ops += res.Report.Ops
			recoveries = append(recoveries, res.Report.Recoveries...)
			checkTimes = append(checkTimes, res.Report.Time)
		}
		switch {
		case res.Report != nil && res.Report.Failed():
			failed++
		case res.Err != nil:
			errored++
		}
	}
	fmt.Printf("%d trials in %v: %d with violations, %d harness errors; %d operations checked; check time p50 %v max %v; recovery after leader loss (%d) p50 %v max %v\n",
		*trials, time.Since(start).Round(time.Second), failed, errored, ops,
		check.Percentile(checkTimes, 50).Round(time.Millisecond), check.Percentile(checkTimes, 100).Round(time.Millisecond),
		len(recoveries), check.Percentile(recoveries, 50).Round(time.Millisecond), check.Percentile(recoveries, 100).Round(time.Millisecond))
	if p50, bound := check.Percentile(recoveries, 50), harness.RecoveryP50Bound*100*time.Millisecond; len(recoveries) >= 10 && p50 > bound {
		fmt.Printf("median recovery after a leader loss %v is above %d election timeouts (%v)\n", p50, harness.RecoveryP50Bound, bound)
		failed++
	}
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if failed+errored > 0 {
		os.Exit(1)
	}
}
