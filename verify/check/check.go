package check

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/quorumlock/quorumlock/verify/history"
)

// Checker names, as they appear in violations.
const (
	Linearizable = "linearizability"
	Exclusion    = "mutual-exclusion"
	Tokens       = "tokens"
	Final        = "final-state"
	Lease        = "lease"
	Availability = "availability"
)

// All lists every checker.
var All = []string{Linearizable, Exclusion, Tokens, Final, Lease, Availability}

// Violation is one failed check.
type Violation struct {
	Checker string
	Lock    string
	Msg     string
}

func (v Violation) String() string {
	if v.Lock == "" {
		return fmt.Sprintf("%s: %s", v.Checker, v.Msg)
	}
	return fmt.Sprintf("%s: lock %q: %s", v.Checker, v.Lock, v.Msg)
}

// Options tune the checks.
type Options struct {
	// Timeout bounds porcupine's search per lock; running out of time is a
	// violation. The default is 60 s.
	Timeout time.Duration
	// MaxOpsPerLock is the size above which a lock's history is reported
	// as too large to check (a violation). The default is 4,000.
	MaxOpsPerLock int
}

// Report is the result of checking one history.
type Report struct {
	Violations []Violation
	// Ops is the number of operations checked for linearizability
	// (including the session-end pseudo-operations), PerLock by lock.
	Ops     int
	PerLock map[string]int
	// Writes is the number of writes at the fenced resource (accepted and
	// rejected); LateWrites counts accepted writes that overlapped a newer
	// grant's but had outlived their holder's lease (the case fencing
	// tokens exist for; not a violation).
	Writes, Rejected, LateWrites int
	// Recoveries are the measured unavailability windows after a leader
	// loss.
	Recoveries []time.Duration
	// Elections are the times from those leader losses to a new leader
	// agreed by a majority.
	Elections []time.Duration
	// Unbounded are the recoveries after faults the bound does not apply
	// to (restart of every replica).
	Unbounded []time.Duration
	// Time is how long the checks took; LinTime the porcupine part.
	Time, LinTime time.Duration

	infos map[string]porcupine.LinearizationInfo // per lock, for Visualize
}

// Failed reports whether any check failed.
func (r *Report) Failed() bool { return len(r.Violations) > 0 }

// Fired returns the checkers that reported a violation, sorted.
func (r *Report) Fired() []string {
	var out []string
	for _, v := range r.Violations {
		if !slices.Contains(out, v.Checker) {
			out = append(out, v.Checker)
		}
	}
	sort.Strings(out)
	return out
}

func (r *Report) add(checker, lock, format string, args ...any) {
	r.Violations = append(r.Violations, Violation{Checker: checker, Lock: lock, Msg: fmt.Sprintf(format, args...)})
}

// Run runs every checker on h.
func Run(h *history.History, opts Options) *Report {
	if opts.Timeout == 0 {
		opts.Timeout = 60 * time.Second
	}
	if opts.MaxOpsPerLock == 0 {
		opts.MaxOpsPerLock = 4000
	}
	start := time.Now()
	x := newIndex(h)
	r := &Report{PerLock: make(map[string]int), infos: make(map[string]porcupine.LinearizationInfo)}
	checkLinearizable(x, r, opts)
	checkExclusion(x, r)
	checkTokens(x, r)
	checkFinal(x, r)
	checkLease(x, r)
	checkAvailability(x, r)
	r.Time = time.Since(start)
	return r
}

// Visualize writes porcupine's HTML visualization of every lock checked to
// dir (one file per lock) and returns the paths.
func (r *Report) Visualize(dir string) ([]string, error) {
	var out []string
	names := make([]string, 0, len(r.infos))
	for name := range r.infos {
		names = append(names, name)
	}
	sort.Strings(names)
	for i, name := range names {
		path := filepath.Join(dir, fmt.Sprintf("linearizability-%d-%s.html", i, safe(name)))
		if err := porcupine.VisualizePath(lockModel, r.infos[name], path); err != nil {
			return out, err
		}
		out = append(out, path)
	}
	return out, nil
}

func safe(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}

// Summary is a one-line account of the report.
func (r *Report) Summary() string {
	s := fmt.Sprintf("%d ops checked, %d writes (%d rejected by the fence, %d late), check %v (porcupine %v)",
		r.Ops, r.Writes, r.Rejected, r.LateWrites, r.Time.Round(time.Millisecond), r.LinTime.Round(time.Millisecond))
	if len(r.Recoveries) > 0 {
		p50, mx := Percentile(r.Recoveries, 50), Percentile(r.Recoveries, 100)
		s += fmt.Sprintf(", %d recoveries p50 %v max %v (elections p50 %v max %v)", len(r.Recoveries), p50.Round(time.Millisecond), mx.Round(time.Millisecond),
			Percentile(r.Elections, 50).Round(time.Millisecond), Percentile(r.Elections, 100).Round(time.Millisecond))
	}
	return s
}

// Percentile returns the p-th percentile (nearest rank) of ds.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// WriteText writes the violations to path, one per line.
func (r *Report) WriteText(path string) error {
	var b []byte
	for _, v := range r.Violations {
		b = append(b, v.String()...)
		b = append(b, '\n')
	}
	b = append(b, r.Summary()...)
	b = append(b, '\n')
	return os.WriteFile(path, b, 0o644)
}
