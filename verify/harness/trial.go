package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/quorumlock/quorumlock/verify/check"
	"github.com/quorumlock/quorumlock/verify/history"
)

// Options configure one trial. Zero fields are drawn from the seed or take
// the defaults.
type Options struct {
	Seed uint64
	// Size is the number of replicas; 0 draws 3 or 5 from the seed.
	Size int
	// Faults are the kinds the plan draws from (default: FaultKinds);
	// Steps how many (0 draws 2 to 4).
	Faults []string
	Steps  int
	// TTL is the session TTL; 0 draws 1 s or 1.5 s.
	TTL time.Duration
	// Tick and ElectionTicks set raft's timing (default 10 ms x 10).
	Tick          time.Duration
	ElectionTicks int
	// Margin is added to 2 x election timeout for the availability bound
	// on every single recovery. The default is 5 election timeouts: an
	// election that fails once (a split vote, a pre-vote refused by a
	// follower that heard the old leader less than an election timeout
	// ago, or vote messages lost while peer streams reconnect after a
	// heal) takes up to 2 more, and a loaded 2-core machine delays ticks.
	// The typical recovery is held to a tighter bound by the CI set
	// (RecoveryP50Bound).
	Margin time.Duration
	// Workload; zero fields take the defaults.
	Workload WorkloadOptions
	// Out is where a failed trial's artefacts go (a folder per failure is
	// created in it); "" keeps them in the system temp directory.
	Out string
	// Keep saves the artefacts even when the trial passes.
	Keep bool
	// Check options.
	Check check.Options
	// Log receives progress lines (nil: silent).
	Log func(string)
	// System, if set, builds the system instead of a real cluster (the
	// self-test's fake). It gets the trial's work directory.
	System func(dir string, rnd *rand.Rand) (System, error)
	// Procs, if set, is the path of a lockd binary (LockdPackage, built
	// with proctest.Build): the trial runs separate lockd processes
	// (NewProcs) instead of an in-process cluster, with the faults of
	// ProcFaults (the default there).
	Procs string
}

// Result is the outcome of one trial.
type Result struct {
	Seed     uint64
	Plan     []Step
	History  *history.History
	Report   *check.Report
	Err      error  // the harness could not run the trial (not a verdict)
	Dir      string // artefacts folder, when saved
	Duration time.Duration
}

// Failed reports whether a checker fired or the trial could not run.
func (r *Result) Failed() bool { return r.Err != nil || (r.Report != nil && r.Report.Failed()) }

// RecoveryP50Bound is the bound on the median recovery after a leader loss
// over a set of trials, in election timeouts: 3 (300 ms with the trial
// timings), a third above the 2 x election timeout that DESIGN.md sets.
const RecoveryP50Bound = 3

// Locks are the lock names every trial uses.
var Locks = []string{"lock-a", "lock-b", "lock-c"}

// Run runs one trial: start the system, run the workload while the nemesis
// carries out its plan, heal, wait for the cluster to settle, read the
// final state, and check the history.
func Run(opts Options) *Result {
	start := time.Now()
	orig := opts // what the caller set: the replay command repeats it
	opts, plan := draw(opts)
	w := &opts.Workload
	et := time.Duration(opts.ElectionTicks) * opts.Tick
	h := history.New(opts.Seed, Locks)
	h.Config["start"] = time.Now().UTC().Format(time.RFC3339Nano)
	h.Bound = int64(2*et + opts.Margin)
	h.Config["replicas"] = fmt.Sprint(opts.Size)
	h.Config["ttl"] = opts.TTL.String()
	h.Config["tick"] = opts.Tick.String()
	h.Config["election_ticks"] = fmt.Sprint(opts.ElectionTicks)
	h.Config["faults"] = strings.Join(opts.Faults, ",")
	h.Config["workers"] = fmt.Sprint(w.Workers)
	h.Config["readers"] = fmt.Sprint(w.Readers)
	for _, st := range plan {
		h.Schedule = append(h.Schedule, st.String())
	}
	res := &Result{Seed: opts.Seed, Plan: plan, History: h}
	logf := func(format string, args ...any) {
		if opts.Log != nil {
			opts.Log(fmt.Sprintf("seed %d: ", opts.Seed) + fmt.Sprintf(format, args...))
		}
	}

	dir, err := os.MkdirTemp("", fmt.Sprintf("verify-%d-", opts.Seed))
	if err != nil {
		res.Err = err
		return res
	}
	defer os.RemoveAll(dir)

	var sys System
	if opts.Procs != "" {
		if err := checkProcFaults(opts.Faults); err != nil {
			res.Err = err
			return res
		}
	} else if slices.Contains(opts.Faults, CrashPoint) && opts.System == nil {
		res.Err = fmt.Errorf("fault %s needs the multi-process mode (-procs)", CrashPoint)
		return res
	}
	switch {
	case opts.Procs != "" && opts.System == nil:
		sys, err = NewProcs(opts.Procs, ClusterOptions{
			Size: opts.Size, Clients: 2, Tick: opts.Tick, ElectionTicks: opts.ElectionTicks,
			TTL: opts.TTL, Dir: dir,
		})
	case opts.System != nil:
		sys, err = opts.System(dir, rand.New(rand.NewPCG(opts.Seed, 0xfa7e)))
	default:
		sys, err = NewCluster(ClusterOptions{
			Size: opts.Size, Clients: 2, Tick: opts.Tick, ElectionTicks: opts.ElectionTicks,
			TTL: opts.TTL, Seed: opts.Seed | 1, Dir: dir,
		})
	}
	if err != nil {
		res.Err = fmt.Errorf("starting the system: %w", err)
		return res
	}
	logf("%d replicas, TTL %v, plan %v", opts.Size, opts.TTL, plan)

	wl := newWorkload(sys, h, Locks, *w, opts.Seed)
	nm := &nemesis{sys: sys, h: h, ttl: opts.TTL}
	wl.start()
	time.Sleep(opts.TTL / 2)
	var runErr error
	if err := guard(func() { nm.run(plan, nil) }); err != nil {
		runErr = err
	}
	wl.halt()
	final := settle(sys, wl, h, opts.TTL, et)
	sys.Close()
	if len(nm.errs) > 0 {
		runErr = errors.Join(runErr, fmt.Errorf("nemesis: %s", strings.Join(nm.errs, "; ")))
	}
	if final != nil {
		runErr = errors.Join(runErr, final)
	}
	var tbs []*tb
	switch t := sys.(type) {
	case *Cluster:
		tbs = append(tbs, t.t)
	case *Procs:
		tbs = append(tbs, t.t)
	}
	for _, t := range tbs {
		// A replica that failed while it ran (Node.Close/HardClose return
		// the error that stopped it) or could not close is a failed
		// trial, not a line in a log.
		for _, e := range t.errors() {
			logf("cluster: %s", e)
			runErr = errors.Join(runErr, fmt.Errorf("cluster: %s", e))
		}
	}

	res.Report = check.Run(h, opts.Check)
	res.Err = runErr
	res.Duration = time.Since(start)
	if res.Failed() || opts.Keep {
		res.Dir = save(orig, res, dir)
	}
	return res
}

// draw fills the zero fields of opts, drawing the size, TTL and number of
// steps from the seed's generator in that order, and draws the fault plan
// from it. It depends on nothing but opts, so the same seed and the same
// options (the replay command of seed.txt) give the same plan.
func draw(opts Options) (Options, []Step) {
	rnd := rand.New(rand.NewPCG(opts.Seed, 0x71a1))
	if opts.Size == 0 {
		opts.Size = []int{3, 3, 5}[rnd.IntN(3)]
	}
	if opts.TTL == 0 {
		opts.TTL = []time.Duration{time.Second, 1500 * time.Millisecond}[rnd.IntN(2)]
	}
	if opts.Tick == 0 {
		opts.Tick = 10 * time.Millisecond
	}
	if opts.ElectionTicks == 0 {
		opts.ElectionTicks = 10
	}
	et := time.Duration(opts.ElectionTicks) * opts.Tick
	if opts.Margin == 0 {
		opts.Margin = 5 * et
	}
	if len(opts.Faults) == 0 {
		opts.Faults = FaultKinds
		if opts.Procs != "" {
			opts.Faults = ProcFaults
		}
	}
	if opts.Steps == 0 {
		opts.Steps = 2 + rnd.IntN(3)
	}
	w := &opts.Workload
	if w.Workers == 0 {
		w.Workers = 6
	}
	if w.Readers == 0 {
		w.Readers = 2
	}
	if w.Pace == 0 {
		w.Pace = 15 * time.Millisecond
	}
	if w.AcquireTimeout == 0 {
		w.AcquireTimeout = 800 * time.Millisecond
	}
	return opts, Plan(rnd, opts.Faults, opts.Steps, opts.TTL)
}

// settle ends a trial: heal and restart everything, wait for a leader and
// for the cluster's session list to agree with the clients (sessions that
// ended for their clients stop heartbeating, so the cluster must expire
// them within about a TTL), then read every lock once more (the final
// reads) and record which sessions the cluster lists.
func settle(sys System, wl *workload, h *history.History, ttl, et time.Duration) error {
	sys.Heal()
	var errs []error
	for _, id := range sys.Members() {
		if !contains(sys.Running(), id) {
			if err := sys.Restart(id); err != nil {
				errs = append(errs, fmt.Errorf("restart %d: %w", id, err))
			}
		}
	}
	if sys.WaitLeader(10*time.Second) == 0 {
		errs = append(errs, errors.New("no leader after healing"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	deadline := time.Now().Add(3*ttl + 10*et)
	var listed map[uint64]bool
	for {
		var err error
		listed, err = sys.LiveSessions(ctx)
		if err == nil && agrees(listed, wl.sessions()) {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, name := range Locks {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		call := h.Now()
		info, err := sys.Read(rctx, name)
		ret := h.Now()
		rcancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("final read of %s: %w", name, err))
			continue
		}
		h.Add(history.Op{Client: wl.opts.Workers + wl.opts.Readers + i, Kind: history.Read, Lock: name, Holder: info.Holder, Token: info.Token,
			Waiters: info.Waiters, Via: "final", Call: call, Return: ret, Final: true})
	}
	if l, err := sys.LiveSessions(ctx); err == nil {
		listed = l
	} else if listed == nil {
		errs = append(errs, fmt.Errorf("final session list: %w", err))
	}
	now := h.Now()
	close(wl.end)
	wl.watches.Wait()
	for _, ts := range wl.sessions() {
		d := h.At(ts.s.Deadline())
		h.Update(func() {
			ts.rec.ListedAtEnd = listed[ts.rec.ID]
			if !ts.rec.ListedAtEnd {
				ts.rec.Gone = now
			}
			if ts.rec.Ended == 0 {
				ts.rec.Deadline = d
			}
		})
	}
	return errors.Join(errs...)
}

// agrees reports whether the cluster lists exactly the sessions alive for
// their clients.
func agrees(listed map[uint64]bool, sessions []*trackedSession) bool {
	alive := 0
	for _, ts := range sessions {
		live := ts.s.Err() == nil
		if live != listed[ts.s.ID()] {
			return false
		}
		if live {
			alive++
		}
	}
	return alive == len(listed)
}

// save writes a trial's artefacts into a new folder and returns its path.
func save(opts Options, res *Result, work string) string {
	base := opts.Out
	if base == "" {
		base = os.TempDir()
	}
	dir := filepath.Join(base, fmt.Sprintf("verify-seed-%d-%s", res.Seed, time.Now().Format("20060102-150405.000")))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "seed: %d\nreplay: %s", res.Seed, replayCommand(opts))
	if opts.System != nil {
		b.WriteString(" (self-test: the Fake lock service; rerun the self-test instead)")
	}
	fmt.Fprintf(&b, "\nconfig: %v\n", res.History.Config)
	if res.Err != nil {
		fmt.Fprintf(&b, "harness error: %v\n", res.Err)
	}
	os.WriteFile(filepath.Join(dir, "seed.txt"), []byte(b.String()), 0o644)
	var sched strings.Builder
	sched.WriteString("# planned\n")
	for _, st := range res.Plan {
		fmt.Fprintln(&sched, st)
	}
	sched.WriteString("# carried out (ms since start)\n")
	for _, f := range res.History.Faults {
		fmt.Fprintf(&sched, "%10.1f %s %s\n", float64(f.At)/1e6, f.Kind, f.Detail)
	}
	os.WriteFile(filepath.Join(dir, "schedule.txt"), []byte(sched.String()), 0o644)
	res.History.Save(filepath.Join(dir, "history.json"))
	if res.Report != nil {
		res.Report.WriteText(filepath.Join(dir, "violations.txt"))
		res.Report.Visualize(dir)
	}
	copyFile(filepath.Join(work, "replicas.log"), filepath.Join(dir, "replicas.log"))
	dumpLogs(work, filepath.Join(dir, "raftlog.txt"))
	return dir
}

// replayCommand is the command that runs a trial with the options the
// caller set (opts before draw) again: the same seed, the same plan.
func replayCommand(opts Options) string {
	var b strings.Builder
	for _, env := range []string{"VERIFY_BACKEND", "VERIFY_SNAPSHOT_ENTRIES"} {
		if v := os.Getenv(env); v != "" {
			fmt.Fprintf(&b, "%s=%s ", env, v)
		}
	}
	fmt.Fprintf(&b, "go run ./verify -trials 1 -seed %d", opts.Seed)
	if opts.Procs != "" {
		b.WriteString(" -procs")
	}
	if len(opts.Faults) > 0 {
		fmt.Fprintf(&b, " -faults %s", strings.Join(opts.Faults, ","))
	}
	if opts.Size != 0 {
		fmt.Fprintf(&b, " -replicas %d", opts.Size)
	}
	if opts.Steps != 0 {
		fmt.Fprintf(&b, " -steps %d", opts.Steps)
	}
	if opts.Margin != 0 {
		fmt.Fprintf(&b, " -margin %v", opts.Margin)
	}
	return b.String()
}

func copyFile(from, to string) {
	in, err := os.Open(from)
	if err != nil {
		return
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return
	}
	defer out.Close()
	io.Copy(out, in)
}

// Summary is a one-line account of a result.
func (r *Result) Summary() string {
	var kinds []string
	for _, st := range r.Plan {
		kinds = append(kinds, st.Kind)
	}
	s := fmt.Sprintf("seed %d: %s [%s] %v", r.Seed, verdict(r), strings.Join(kinds, " "), r.Duration.Round(100*time.Millisecond))
	if r.Report != nil {
		s += "; " + r.Report.Summary()
	}
	if r.Dir != "" {
		s += "; artefacts in " + r.Dir
	}
	return s
}

func verdict(r *Result) string {
	switch {
	case r.Report != nil && r.Report.Failed():
		return "VIOLATION " + strings.Join(r.Report.Fired(), ",")
	case r.Err != nil:
		return "ERROR " + r.Err.Error()
	}
	return "ok"
}
