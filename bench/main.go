// Command bench runs quorumlock's benchmark suite side by side with etcd's
// own lock path: for every scenario, a quorumlock cluster (public API only)
// and an embedded etcd v3 cluster driven through client/v3 and its
// concurrency Mutex and leases, one after the other, in this process, on
// this machine, on loopback, with fsync on for both and the same raft
// timing (100 ms ticks, 1 s election timeout). memory_1m runs quorumlock's
// clients in a child process (this binary, re-executed; see memClientCmd)
// so that this process's heap holds only the replicas.
//
//	go run ./bench                        # every scenario, full size (~9 min)
//	go run ./bench -quick -json out.json  # every scenario, scaled down (< 3 min)
//	go run ./bench -scenarios latency_1,handoff_16 -duration 5s
//	go run ./bench -scenarios uncontended_64,handoff_16 -rounds 5   # medians of 5
//	go run ./bench -scenarios expiry_storm -systems ours -cpuprofile /tmp/prof
//
// It prints a table (scenario, ours, etcd, ratio = ours/etcd, unit, goal,
// met?) on stdout, progress on stderr, and with -json a JSON object
// {"scenarios": {NAME: {"ours": X, "etcd": Y, "ratio": R, "unit": U, ...}}}.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/grpclog"

	"github.com/quorumlock/quorumlock"
)

// params are the knobs of one run.
type params struct {
	quick    bool
	dir      string        // parent of every data directory and the fsync probe
	duration time.Duration // measurement window of the loop scenarios
	warmup   time.Duration

	hbSessions, etcdHBSessions int
	hbTTL, hbWindow            time.Duration

	memSessions, memLocks int

	stormSessions, etcdStormSessions int
	stormTTL, stormMaxWait           time.Duration

	failoverRepeats int
	rounds          int // runs of each scenario per system; the median counts
	client          clientPath

	prof *profiler // nil: no profiling (etcd runs, or no -cpuprofile)
}

// scenario is one row of the table.
type scenario struct {
	name string
	unit string
	goal string
	run  func(ctx context.Context, sys system, p *params) (measure, error)
	// judge says whether the goal is met ("yes", "no", "-").
	judge func(r *row) string
}

func scenarios() []scenario {
	ratioAtLeast := func(x float64) func(r *row) string {
		return func(r *row) string {
			if r.ours == nil || r.etcd == nil {
				return "?"
			}
			return yesNo(r.ours.value >= x*r.etcd.value)
		}
	}
	return []scenario{
		{name: "uncontended_64", unit: "cycles/s", goal: ">= 10x etcd", run: uncontended(64, 3), judge: ratioAtLeast(10)},
		{name: "uncontended_256", unit: "cycles/s", goal: ">= 10x etcd", run: uncontended(256, 3), judge: ratioAtLeast(10)},
		{name: "latency_1", unit: "ms (acquire p50)", goal: "<= fsync p50 + 0.5 ms", run: latency1, judge: func(r *row) string {
			if r.ours == nil || r.fsyncP50 == 0 {
				return "?"
			}
			return yesNo(r.ours.value <= r.fsyncP50+0.5)
		}},
		{name: "handoff_16", unit: "hand-offs/s", goal: ">= 10x etcd", run: handoff(16), judge: ratioAtLeast(10)},
		{name: "heartbeats", unit: "heartbeats/s per core", goal: ">= 100,000/s per core, 0 log entries",
			run: func(ctx context.Context, sys system, p *params) (measure, error) { return sys.Heartbeats(ctx, p) },
			judge: func(r *row) string {
				if r.ours == nil {
					return "?"
				}
				e, _ := r.ours.extra["log_entries_added"].(uint64)
				return yesNo(r.ours.value >= 100_000 && e == 0)
			}},
		{name: "memory_1m", unit: "heap B per lock x replica", goal: "<= 150 B",
			run: func(ctx context.Context, sys system, p *params) (measure, error) { return sys.Memory(ctx, p) },
			judge: func(r *row) string {
				if r.ours == nil {
					return "?"
				}
				return yesNo(r.ours.value <= 150)
			}},
		{name: "failover", unit: "ms (p50)", goal: "<= 2 x election timeout (2000 ms), max too", run: failover, judge: func(r *row) string {
			if r.ours == nil {
				return "?"
			}
			mx, _ := r.ours.extra["max_ms"].(float64)
			return yesNo(r.ours.value <= 2*ms(election) && mx <= 2*ms(election))
		}},
		{name: "expiry_storm", unit: "s after TTL", goal: "<= 2 s", run: func(ctx context.Context, sys system, p *params) (measure, error) { return sys.ExpiryStorm(ctx, p) },
			judge: func(r *row) string {
				if r.ours == nil {
					return "?"
				}
				return yesNo(r.ours.value <= 2 && r.ours.extra["incomplete"] == nil)
			}},
		{name: "five_replicas", unit: "cycles/s", goal: "report", run: uncontended(64, 5), judge: func(*row) string { return "-" }},
		{name: "leader_shutdown", unit: "ms (p50)", goal: "report", run: leaderShutdown, judge: func(*row) string { return "-" }},
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == memClientCmd {
		// The client process of memory_1m (hidden; see memClientCmd).
		grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, io.Discard))
		os.Exit(memClientMain(os.Args[2:], os.Stdin, os.Stdout))
	}
	var (
		quick        = flag.Bool("quick", false, "run every scenario briefly, with 100k/1M scaled down (under 3 minutes)")
		only         = flag.String("scenarios", "", "comma-separated scenarios to run (default: all)")
		systems      = flag.String("systems", "ours,etcd", "systems to run: ours, etcd or both")
		duration     = flag.Duration("duration", 0, "measurement window of the loop scenarios (default 10s, quick 2s)")
		jsonOut      = flag.String("json", "", "write the results as JSON to this file")
		cpuProfile   = flag.String("cpuprofile", "", "write CPU profiles of quorumlock's measured phases to PREFIX.<scenario>.pprof")
		memProfile   = flag.String("memprofile", "", "write a heap profile of quorumlock after memory_1m to PREFIX.memory_1m.heap.pprof")
		allocProfile = flag.String("allocprofile", "", "write allocation profiles around quorumlock's measured phase of each scenario to PREFIX.<scenario>.allocs{-base,}.pprof (compare with go tool pprof -diff_base)")
		dir          = flag.String("dir", "", "parent directory of the data directories (default: the system temp dir)")
		sessions     = flag.Int("sessions", 0, "override the 100,000 sessions of heartbeats, memory_1m and expiry_storm")
		etcdHB       = flag.Int("etcd-hb-sessions", 0, "override etcd's lease count in heartbeats (default 50,000; quick: as ours)")
		etcdStorm    = flag.Int("etcd-storm-sessions", 0, "override etcd's lease count in expiry_storm (default 50,000; quick: as ours)")
		repeats      = flag.Int("failover-repeats", 0, "failover repeats (default 10, quick 2)")
		backend      = flag.String("backend", "pebble", "quorumlock's log backend (Config.LogBackend): pebble or wal")
		client       = flag.String("client", string(inProcess), "how the lockers of the loop scenarios and failover reach either system: inproc (quorumlock's Node.NewSession, etcd's v3client.New(e.Server)) or grpc (quorumlock.Dial, clientv3.New, over loopback)")
		rounds       = flag.Int("rounds", 1, "run each scenario this many times per system, alternating which goes first, and report each system's median (odd counts give a true median)")
	)
	flag.Parse()
	// A finer heap sample than the default 512 KiB, for memory_1m's split
	// of the heap by allocation site (set before anything allocates much).
	runtime.MemProfileRate = 64 << 10
	// gRPC's own logging (connection errors while members stop) would bury
	// the table.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, io.Discard))

	p := &params{
		quick:           *quick,
		duration:        10 * time.Second,
		warmup:          time.Second,
		hbSessions:      100_000,
		hbTTL:           defaultTTL,
		hbWindow:        20 * time.Second,
		memSessions:     100_000,
		memLocks:        1_000_000,
		stormSessions:   100_000,
		stormTTL:        defaultTTL,
		stormMaxWait:    240 * time.Second,
		failoverRepeats: 10,
	}
	if *quick {
		p.duration, p.warmup = 2*time.Second, 500*time.Millisecond
		p.hbSessions, p.hbTTL, p.hbWindow = 5_000, 3*time.Second, 3*time.Second
		p.memSessions, p.memLocks = 5_000, 50_000
		p.stormSessions, p.stormTTL, p.stormMaxWait = 5_000, 3*time.Second, 30*time.Second
		p.failoverRepeats = 2
	}
	if *duration > 0 {
		p.duration = *duration
	}
	if *sessions > 0 {
		p.memLocks = p.memLocks / p.memSessions * *sessions
		p.hbSessions, p.memSessions, p.stormSessions = *sessions, *sessions, *sessions
	}
	p.etcdHBSessions, p.etcdStormSessions = p.hbSessions, p.stormSessions
	if !*quick && *sessions == 0 {
		// etcd does not carry 100,000 kept-alive leases on this 2-core box
		// next to its own clients: granting slowed to ~380/s and 95% of the
		// leases expired before the window (run of 2026-11-30). Scaled
		// down, and said so in the output.
		p.etcdHBSessions, p.etcdStormSessions = 50_000, 50_000
	}
	if *etcdHB > 0 {
		p.etcdHBSessions = *etcdHB
	}
	if *etcdStorm > 0 {
		p.etcdStormSessions = *etcdStorm
	}
	if *repeats > 0 {
		p.failoverRepeats = *repeats
	}
	if *rounds < 1 {
		fatal(fmt.Errorf("-rounds %d: want at least 1", *rounds))
	}
	p.rounds = *rounds
	base, err := os.MkdirTemp(*dir, "quorumlock-bench-")
	if err != nil {
		fatal(err)
	}
	defer os.RemoveAll(base)
	p.dir = base

	var run []scenario
	for _, sc := range scenarios() {
		if *only == "" || slices.Contains(strings.Split(*only, ","), sc.name) {
			run = append(run, sc)
		}
	}
	if len(run) == 0 {
		fatal(fmt.Errorf("no scenario matches %q", *only))
	}
	if b := quorumlock.LogBackend(*backend); b != quorumlock.LogPebble && b != quorumlock.LogWAL {
		fatal(fmt.Errorf("-backend %q is neither %q nor %q", b, quorumlock.LogPebble, quorumlock.LogWAL))
	}
	path := clientPath(*client)
	if path != inProcess && path != overGRPC {
		fatal(fmt.Errorf("-client %q is neither %q nor %q", path, inProcess, overGRPC))
	}
	p.client = path
	var syss []system
	for _, s := range []system{qlSystem{backend: quorumlock.LogBackend(*backend), client: path}, etcdSystem{client: path}} {
		if slices.Contains(strings.Split(*systems, ","), s.Name()) {
			syss = append(syss, s)
		}
	}
	if len(syss) == 0 {
		fatal(fmt.Errorf("no system matches %q", *systems))
	}

	rep := &report{params: p, start: time.Now()}
	for k, sc := range run {
		r := &row{sc: sc}
		for j := range p.rounds {
			runRound(r, sc, syss, p, k+j, j, base, profiler{cpu: *cpuProfile, mem: *memProfile, allocs: *allocProfile})
		}
		r.finish()
		rep.rows = append(rep.rows, r)
	}
	rep.end = time.Now()
	rep.print(os.Stdout)
	if *jsonOut != "" {
		if err := rep.writeJSON(*jsonOut); err != nil {
			fatal(err)
		}
	}
	if n := rep.failedRounds(); n > 0 {
		fmt.Fprintf(os.Stderr, "bench: %d scenario round(s) failed; the table and JSON mark them\n", n)
		os.Exit(1)
	}
}

// runRound runs scenario sc once on every system of syss, into r: round j
// (from 0) of p.rounds, with the k-th alternation of which system goes
// first. Quorumlock's profiles (prof: the file prefixes of -cpuprofile and
// the others) cover its first round only.
func runRound(r *row, sc scenario, syss []system, p *params, k, j int, base string, prof profiler) {
	label := sc.name
	if p.rounds > 1 {
		label = fmt.Sprintf("%s (round %d/%d)", sc.name, j+1, p.rounds)
	}
	if sc.name == "latency_1" {
		ds, err := fsyncLatency(base, 2000, 3*time.Second)
		if err != nil {
			fatal(err)
		}
		p50, p99 := ms(percentile(ds, 50)), ms(percentile(ds, 99))
		r.addFsync(p50, p99)
		logf("fsync (write 100 B + fdatasync, %d samples): p50 %.3f ms, p99 %.3f ms", len(ds), p50, p99)
	}
	// Alternate which system goes first.
	order := slices.Clone(syss)
	if k%2 == 1 {
		slices.Reverse(order)
	}
	for _, sys := range order {
		logf("%s / %s ...", label, sys.Name())
		sp := *p
		sp.prof = nil
		if sys.Name() == "ours" && j == 0 {
			pr := prof
			pr.scenario = sc.name
			sp.prof = &pr
		}
		budget := 10 * time.Minute
		if p.quick {
			budget = 90 * time.Second
		}
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		t, load0 := time.Now(), loadAvg()
		m, err := sc.run(ctx, sys, &sp)
		cancel()
		sp.prof.stop()
		if err == nil {
			m.extra["loadavg_before"], m.extra["loadavg_after"] = load0, loadAvg()
		}
		if err != nil {
			logf("%s / %s failed after %v: %v", label, sys.Name(), time.Since(t).Round(time.Millisecond), err)
			r.add(sys.Name(), nil, err)
		} else {
			logf("%s / %s: %.4g %s (%v)", label, sys.Name(), m.value, sc.unit, time.Since(t).Round(time.Millisecond))
			r.add(sys.Name(), &m, nil)
		}
		settle()
	}
}

// settle lets the goroutines of a closed cluster finish and returns their
// memory before the next measurement.
func settle() {
	time.Sleep(time.Second)
	runtime.GC()
	logf("  (goroutines left: %d)", runtime.NumGoroutine())
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// profiler writes a CPU profile of quorumlock's measured phase of one
// scenario, allocation profiles at its start and end, and a heap profile
// where asked. A nil profiler does nothing.
type profiler struct {
	cpu, mem, allocs string
	scenario         string
	f                *os.File
	started          bool
}

func (pr *profiler) start() {
	if pr == nil || pr.started {
		return
	}
	pr.started = true
	pr.writeAllocs("allocs-base")
	if pr.cpu == "" {
		return
	}
	f, err := os.Create(fmt.Sprintf("%s.%s.pprof", pr.cpu, pr.scenario))
	if err != nil {
		logf("cpuprofile: %v", err)
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		logf("cpuprofile: %v", err)
		f.Close()
		return
	}
	pr.f = f
}

func (pr *profiler) stop() {
	if pr == nil || !pr.started {
		return
	}
	pr.started = false
	pr.writeAllocs("allocs")
	if pr.f == nil {
		return
	}
	pprof.StopCPUProfile()
	pr.f.Close()
	logf("  wrote %s", pr.f.Name())
	pr.f = nil
}

// writeAllocs writes the allocation profile (every allocation since the
// process started, sampled) to PREFIX.<scenario>.<suffix>.pprof.
func (pr *profiler) writeAllocs(suffix string) {
	if pr.allocs != "" {
		writeProfile("allocs", fmt.Sprintf("%s.%s.%s.pprof", pr.allocs, pr.scenario, suffix))
	}
}

// heap writes the heap profile to PREFIX.<scenario>.heap.pprof.
func (pr *profiler) heap() {
	if pr != nil && pr.mem != "" {
		writeProfile("heap", fmt.Sprintf("%s.%s.heap.pprof", pr.mem, pr.scenario))
	}
}

// writeProfile writes the runtime profile name to path; errors are logged.
func writeProfile(name, path string) {
	f, err := os.Create(path)
	if err != nil {
		logf("%s profile: %v", name, err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		logf("%s profile: %v", name, err)
		return
	}
	logf("  wrote %s", path)
}
