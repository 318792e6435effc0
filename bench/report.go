package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// row is one scenario's results. With -rounds N each system runs the
// scenario N times; add collects the rounds and finish sets ours and etcd
// to the median round.
type row struct {
	sc                 scenario
	ours, etcd         *measure
	oursErr, etcdErr   error
	fsyncP50, fsyncP99 float64 // ms; latency_1 only (median over rounds)

	// Every round, in order: the measure (nil where the round failed) and
	// the error (nil where it succeeded); fsync probe p50s and p99s.
	oursRuns, etcdRuns []*measure
	oursErrs, etcdErrs []error
	fsyncP50s          []float64
	fsyncP99s          []float64
}

// add records one round of sys: m, or err if the round failed.
func (r *row) add(sys string, m *measure, err error) {
	if err != nil {
		m = nil
	}
	if sys == "ours" {
		r.oursRuns, r.oursErrs = append(r.oursRuns, m), append(r.oursErrs, err)
	} else {
		r.etcdRuns, r.etcdErrs = append(r.etcdRuns, m), append(r.etcdErrs, err)
	}
}

// addFsync records one round's fsync probe (latency_1), in ms.
func (r *row) addFsync(p50, p99 float64) {
	r.fsyncP50s, r.fsyncP99s = append(r.fsyncP50s, p50), append(r.fsyncP99s, p99)
}

// finish sets each system's result from its rounds: the median round
// (median), or its first error when no round succeeded; and the fsync
// probe's p50 and p99 to their medians.
func (r *row) finish() {
	r.ours, r.oursErr = medianRound(r.oursRuns, r.oursErrs)
	r.etcd, r.etcdErr = medianRound(r.etcdRuns, r.etcdErrs)
	r.fsyncP50, r.fsyncP99 = medianFloat(r.fsyncP50s), medianFloat(r.fsyncP99s)
}

func medianRound(runs []*measure, errs []error) (*measure, error) {
	if m := median(runs); m != nil {
		return m, nil
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// median returns the measure of median value among ms, nil entries (failed
// rounds) left out: the middle one for an odd count; for an even count a
// copy of the lower of the two middle ones whose value is their mean. It
// returns nil if ms holds no measure. ms is not reordered.
func median(ms []*measure) *measure {
	var ok []*measure
	for _, m := range ms {
		if m != nil {
			ok = append(ok, m)
		}
	}
	if len(ok) == 0 {
		return nil
	}
	slices.SortStableFunc(ok, func(a, b *measure) int { return cmp.Compare(a.value, b.value) })
	mid := ok[(len(ok)-1)/2]
	if len(ok)%2 == 1 {
		return mid
	}
	m := &measure{value: (mid.value + ok[len(ok)/2].value) / 2, extra: maps.Clone(mid.extra)}
	return m
}

// medianFloat returns the median of vs (the mean of the two middle values
// for an even count), or 0 if vs is empty.
func medianFloat(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(vs))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// values returns each round's value, NaN where the round failed.
func values(ms []*measure) []float64 {
	out := make([]float64, len(ms))
	for i, m := range ms {
		out[i] = math.NaN()
		if m != nil {
			out[i] = m.value
		}
	}
	return out
}

// roundRatios returns ours/etcd for each round in which both succeeded
// (NaN in the others): the two ran next to each other, so their ratio is
// the fairest single-round comparison.
func (r *row) roundRatios() []float64 {
	n := min(len(r.oursRuns), len(r.etcdRuns))
	out := make([]float64, n)
	for i := range n {
		out[i] = math.NaN()
		if o, e := r.oursRuns[i], r.etcdRuns[i]; o != nil && e != nil && e.value != 0 {
			out[i] = o.value / e.value
		}
	}
	return out
}

func (r *row) ratio() (float64, bool) {
	if r.ours == nil || r.etcd == nil || r.etcd.value == 0 {
		return 0, false
	}
	return r.ours.value / r.etcd.value, true
}

type report struct {
	params     *params
	start, end time.Time
	rows       []*row
}

func num(m *measure, err error) string {
	switch {
	case err != nil:
		return "ERR"
	case m == nil:
		return "-"
	case m.extra["incomplete"] == true:
		return ">" + format(m.value)
	}
	return format(m.value)
}

func format(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

func (rep *report) print(w io.Writer) {
	p := rep.params
	fmt.Fprintf(w, "\nquorumlock vs etcd v3.7.3 (embedded, client/v3 concurrency Mutex + leases), same process, loopback, fsync on\n")
	fmt.Fprintf(w, "machine: %s/%s, %d CPUs (GOMAXPROCS %d), %s; run %s, took %v\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(),
		rep.start.Format(time.RFC3339), rep.end.Sub(rep.start).Round(time.Second))
	fmt.Fprintf(w, "both: 3 members (five_replicas: 5), tick 100 ms, election timeout 1 s, session/lease TTL 10 s unless noted; ratio = ours/etcd\n")
	fmt.Fprintf(w, "client path (-client) of the loop scenarios and failover: %s\n", clientPathText(p.client))
	if p.quick {
		fmt.Fprintf(w, "QUICK RUN: windows %v; heartbeats %d sessions (TTL %v); memory_1m %d locks over %d sessions; expiry_storm %d sessions (TTL %v); %d failovers\n",
			p.duration, p.hbSessions, p.hbTTL, p.memLocks, p.memSessions, p.stormSessions, p.stormTTL, p.failoverRepeats)
	}
	if p.rounds > 1 {
		fmt.Fprintf(w, "ROUNDS: every scenario ran %d times per system, alternating which went first; the table shows each system's median round, the ratio is of the medians\n", p.rounds)
	}
	if p.etcdHBSessions != p.hbSessions || p.etcdStormSessions != p.stormSessions {
		fmt.Fprintf(w, "ETCD SCALED DOWN: heartbeats %d leases (ours %d), expiry_storm %d leases (ours %d); etcd keepalives and lease grants go through the leader (its best case)\n",
			p.etcdHBSessions, p.hbSessions, p.etcdStormSessions, p.stormSessions)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tours\tetcd\tratio\tunit\tgoal\tmet?")
	for _, r := range rep.rows {
		ratio := "-"
		if x, ok := r.ratio(); ok {
			ratio = fmt.Sprintf("%.2fx", x)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.sc.name, num(r.ours, r.oursErr), num(r.etcd, r.etcdErr),
			ratio, r.sc.unit, r.sc.goal, r.sc.judge(r))
	}
	tw.Flush()
	fmt.Fprintln(w, "\nnotes:")
	for _, r := range rep.rows {
		for _, line := range r.notes() {
			fmt.Fprintf(w, "  %s: %s\n", r.sc.name, line)
		}
	}
}

// notes are the details of a row worth reading next to the table.
func (r *row) notes() []string {
	var out []string
	f := func(m *measure, k string) string {
		if m == nil {
			return "-"
		}
		switch v := m.extra[k].(type) {
		case float64:
			return format(v)
		case nil:
			return "-"
		default:
			return fmt.Sprint(v)
		}
	}
	both := func(label, k string) {
		out = append(out, fmt.Sprintf("%s: ours %s, etcd %s", label, f(r.ours, k), f(r.etcd, k)))
	}
	switch r.sc.name {
	case "uncontended_64", "uncontended_256", "five_replicas", "handoff_16":
		both("acquire p50 ms", "acquire_p50_ms")
		both("acquire p99 ms", "acquire_p99_ms")
		both("process CPU us per cycle (all replicas and clients)", "cpu_us_per_cycle")
		both("process cores busy", "process_cores_busy")
		both("log fsyncs per cycle (every member; ours: quorumlock_log_save_seconds, etcd: etcd_disk_wal_fsync_duration_seconds)", "log_syncs_per_cycle")
		both("log fsync mean ms (ours: the whole Save, Pebble's commit pipeline and WAL sync goroutine included; etcd: the fdatasync call)", "log_sync_mean_ms")
		both("goroutine scheduling latency p50 us (runnable -> running)", "sched_latency_p50_us")
		both("goroutine scheduling latency p90 us", "sched_latency_p90_us")
		both("errors", "errors")
	case "latency_1":
		out = append(out, fmt.Sprintf("fsync (write 100 B + fdatasync) p50 %.3f ms, p99 %.3f ms -> goal p50 <= %.3f ms", r.fsyncP50, r.fsyncP99, r.fsyncP50+0.5))
		both("acquire p99 ms", "acquire_p99_ms")
		both("release p50 ms", "release_p50_ms")
		out = append(out, "the single client runs on the leader's member, on the run's client path")
	case "heartbeats":
		both("sessions", "sessions")
		both("offered heartbeats/s", "offered_per_s")
		both("absorbed heartbeats/s", "absorbed_per_s")
		both("process CPU us per heartbeat", "cpu_us_per_heartbeat")
		both("process cores busy", "process_cores_busy")
		both("idle cluster cores busy (before sessions)", "idle_cluster_cores_busy")
		both("log entries added in the window", "log_entries_added")
		both("sessions lost", "sessions_lost")
		out = append(out, "CPU is the whole process (leader, followers and all clients share it), so per-core = heartbeats / process CPU seconds understates what the leader alone absorbs")
	case "memory_1m":
		both("locks", "locks")
		both("sessions", "sessions")
		both("split by allocation site: replica bytes per lock x replica", "replica_bytes_per_lock_x_replica")
		both("split by allocation site: bench (names) bytes per lock", "bench_bytes_per_lock")
		both("split by allocation site: other bytes per lock", "other_bytes_per_lock")
		both("client bytes per lock (ours: client process heap; etcd: allocation site)", "client_bytes_per_lock")
		both("per session (allocation site): replica bytes per session x replica", "replica_bytes_per_session_x_replica")
		both("per session: client bytes per session (ours: client process heap; etcd: allocation site)", "client_bytes_per_session")
		both("acquires/s during setup", "acquires_per_s")
		both("process RSS growth per lock x replica (Go heap, off-heap memory such as Pebble's memtables and bbolt's mmap, and freed heap not yet returned; not the goal's measure)", "rss_growth_bytes_per_lock_x_replica")
		out = append(out, "value: live Go heap after GC of the bench process, delta over the locks, divided by locks x 3. "+
			"ours: the bench process holds the 3 replicas only; the sessions and Lock handles live in a child client process (quorumlock.Dial, over gRPC on loopback), "+
			"whose own heap growth is reported as client bytes but is not in the value; in the split, quorumlock's root package counts as replica side (Node, gRPC service, router). "+
			"etcd: the 3 members and their client/v3 clients share the process (the clients keep nothing per key); keys were written in Mutex layout 10 per txn")
	case "failover":
		both("max ms", "max_ms")
		both("all ms", "all_ms")
		out = append(out, "ours: one Acquire spans the failover (the session re-sends); etcd: a new Lock attempt every 20 ms (each up to 1 s), first success counts; members stopped without leadership transfer (ours: Node.HardClose, etcd: HardStop)")
	case "leader_shutdown":
		both("max ms", "max_ms")
		both("all ms", "all_ms")
		out = append(out, "as failover, but the leader is shut down gracefully: both hand leadership over before stopping (ours: Node.Close, etcd: Etcd.Close)")
	case "expiry_storm":
		both("sessions", "sessions")
		both("last TTL passed after close, s", "last_ttl_passed_after_close_s")
		both("all free after close, s", "all_free_after_close_s")
		both("all free after close + TTL, s", "after_close_plus_ttl_s")
		both("still held at deadline", "still_held_at_deadline")
		out = append(out, fmt.Sprintf("ours: %s entries applied after the close, the first %s s after it; measured to the leader's last apply (Status().Applied watched every 1 ms), then every lock checked free with Holder; closed in a heartbeat lull: %s",
			f(r.ours, "entries_applied_after_close"), f(r.ours, "first_apply_after_close_s"), f(r.ours, "closed_in_heartbeat_lull")))
		if r.etcd != nil {
			out = append(out, fmt.Sprint(r.etcd.extra["note"]))
		}
	}
	if len(r.oursRuns) > 1 || len(r.etcdRuns) > 1 {
		out = append(out, fmt.Sprintf("rounds (the table shows each system's median; load and other notes are the median round's): ours %s, etcd %s, ratio per round %s",
			formatList(values(r.oursRuns), format), formatList(values(r.etcdRuns), format),
			formatList(r.roundRatios(), func(x float64) string { return fmt.Sprintf("%.2fx", x) })))
		if len(r.fsyncP50s) > 1 {
			out = append(out, "fsync probe p50 ms per round: "+formatList(r.fsyncP50s, format))
		}
		for _, f := range []struct {
			sys  string
			m    *measure
			errs []error
		}{{"ours", r.ours, r.oursErrs}, {"etcd", r.etcd, r.etcdErrs}} {
			if n, first := countErrs(f.errs); n > 0 && f.m != nil {
				out = append(out, fmt.Sprintf("%s failed in %d of %d rounds (left out of the median), first: %v", f.sys, n, len(f.errs), first))
			}
		}
	}
	out = append(out, fmt.Sprintf("machine load (1-min average) before->after: ours %s->%s, etcd %s->%s",
		f(r.ours, "loadavg_before"), f(r.ours, "loadavg_after"), f(r.etcd, "loadavg_before"), f(r.etcd, "loadavg_after")))
	if r.oursErr != nil {
		out = append(out, "ours failed: "+r.oursErr.Error())
	}
	if r.etcdErr != nil {
		out = append(out, "etcd failed: "+r.etcdErr.Error())
	}
	if r.ours != nil && r.ours.extra["first_error"] != nil {
		out = append(out, fmt.Sprint("ours first error: ", r.ours.extra["first_error"]))
	}
	if r.etcd != nil && r.etcd.extra["first_error"] != nil {
		out = append(out, fmt.Sprint("etcd first error: ", r.etcd.extra["first_error"]))
	}
	return out
}

// formatList formats vs as "[a b c]", "-" for a NaN (a failed round).
func formatList(vs []float64, f func(float64) string) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = "-"
		if !math.IsNaN(v) {
			parts[i] = f(v)
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// jsonList is vs for JSON: null for a NaN (a failed round).
func jsonList(vs []float64) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		if !math.IsNaN(v) {
			out[i] = v
		}
	}
	return out
}

// clientPathText says what path means for each system.
func clientPathText(path clientPath) string {
	if path == overGRPC {
		return "grpc, both over loopback gRPC (ours: quorumlock.Dial at the member, following leader hints; etcd: clientv3.New pinned to the member)"
	}
	return "inproc, both in process (ours: Node.NewSession on the member; etcd: v3client.New(e.Server) on the member)"
}

// failedRounds returns how many (scenario, system, round) runs failed. A
// run with any failure exits non-zero, after printing the table and
// writing the JSON, so scripts and CI notice a broken scenario.
func (rep *report) failedRounds() int {
	n := 0
	for _, r := range rep.rows {
		a, _ := countErrs(r.oursErrs)
		b, _ := countErrs(r.etcdErrs)
		n += a + b
	}
	return n
}

// countErrs returns the number of non-nil errors in errs and the first.
func countErrs(errs []error) (n int, first error) {
	for _, err := range errs {
		if err != nil {
			if n == 0 {
				first = err
			}
			n++
		}
	}
	return n, first
}

func (rep *report) writeJSON(path string) error {
	p := rep.params
	out := map[string]any{
		"machine": map[string]any{
			"goos": runtime.GOOS, "goarch": runtime.GOARCH, "cpus": runtime.NumCPU(),
			"gomaxprocs": runtime.GOMAXPROCS(0), "go": runtime.Version(), "host": hostname(),
		},
		"started":  rep.start.Format(time.RFC3339),
		"took_s":   rep.end.Sub(rep.start).Seconds(),
		"quick":    p.quick,
		"baseline": "etcd v3.7.3 embedded (server/v3/embed), client/v3 concurrency Mutex + leases, fsync on",
		"config": map[string]any{
			"tick_ms": ms(tickInterval), "election_timeout_ms": ms(election), "ttl_s": defaultTTL.Seconds(),
			"window_s": p.duration.Seconds(), "warmup_s": p.warmup.Seconds(),
			"heartbeats": map[string]any{"sessions": p.hbSessions, "etcd_sessions": p.etcdHBSessions, "ttl_s": p.hbTTL.Seconds(), "window_s": p.hbWindow.Seconds()},
			"memory_1m":  map[string]any{"sessions": p.memSessions, "locks": p.memLocks},
			"expiry_storm": map[string]any{"sessions": p.stormSessions, "etcd_sessions": p.etcdStormSessions,
				"ttl_s": p.stormTTL.Seconds()},
			"failover_repeats": p.failoverRepeats,
			"rounds":           p.rounds,
			"client_path":      string(p.client),
			"client_path_text": clientPathText(p.client),
		},
	}
	scs := map[string]any{}
	for _, r := range rep.rows {
		e := map[string]any{"unit": r.sc.unit, "goal": r.sc.goal, "met": r.sc.judge(r)}
		put := func(sys string, m *measure, err error) {
			switch {
			case err != nil:
				e[sys] = nil
				e[sys+"_error"] = err.Error()
			case m == nil:
				e[sys] = nil
			default:
				e[sys] = m.value
				keys := make([]string, 0, len(m.extra))
				for k := range m.extra {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				for _, k := range keys {
					e[sys+"_"+k] = m.extra[k]
				}
			}
		}
		put("ours", r.ours, r.oursErr)
		put("etcd", r.etcd, r.etcdErr)
		if x, ok := r.ratio(); ok {
			e["ratio"] = x
		} else {
			e["ratio"] = nil
		}
		if r.fsyncP50 > 0 {
			e["fsync_p50_ms"], e["fsync_p99_ms"] = r.fsyncP50, r.fsyncP99
		}
		if p.rounds > 1 {
			e["ours_rounds"], e["etcd_rounds"] = jsonList(values(r.oursRuns)), jsonList(values(r.etcdRuns))
			e["ratio_rounds"] = jsonList(r.roundRatios())
			if len(r.fsyncP50s) > 0 {
				e["fsync_p50_ms_rounds"] = r.fsyncP50s
			}
		}
		scs[r.sc.name] = e
	}
	out["scenarios"] = scs
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func hostname() string {
	h, _ := os.Hostname()
	return strings.TrimSpace(h)
}
