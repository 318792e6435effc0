// Package history records what the clients of a verification trial did and
// saw: lock operations with their call and return times, sessions and how
// they ended, fenced writes at the protected resource, the faults injected
// and the availability measurements. A History is the only input of the
// checkers (package check) and is saved as JSON when a trial fails.
//
// Times are nanoseconds since the start of the trial on the process's
// monotonic clock (time.Since of one start instant), so every record of a
// trial is comparable with every other.
package history

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"
)

// Open is the return time of an operation whose outcome is unknown: it may
// take effect at any time after its call.
const Open int64 = -1

// Kind is the kind of a lock operation.
type Kind string

// Lock operation kinds.
const (
	Acquire Kind = "acquire" // Session.Acquire (blocking, FIFO)
	Try     Kind = "try"     // Session.TryAcquire
	Release Kind = "release" // Lock.Release of Token
	Read    Kind = "read"    // Holder (a linearizable read)
)

// Outcome is what an operation returned, as the checkers understand it.
type Outcome string

// Outcomes.
const (
	OK        Outcome = "ok"        // acquire: granted Token; release: released
	Locked    Outcome = "locked"    // TryAcquire: held by another session
	Cancelled Outcome = "cancelled" // acquire: ctx ended, settled as not granted and not queued
	NotHeld   Outcome = "not-held"  // release: the grant was no longer current
	Ambiguous Outcome = "ambiguous" // may or may not have taken effect, at any time after Call
)

// Op is one lock operation.
type Op struct {
	ID      int      `json:"id"`
	Client  int      `json:"client"` // worker or reader number
	Kind    Kind     `json:"kind"`
	Lock    string   `json:"lock"`
	Session uint64   `json:"session,omitempty"` // acting session (0 for reads)
	Token   uint64   `json:"token,omitempty"`   // acquire: granted; release: released (input)
	Outcome Outcome  `json:"outcome"`
	Holder  uint64   `json:"holder,omitempty"`  // read: holder session (0 = free)
	Waiters []uint64 `json:"waiters,omitempty"` // read: waiting sessions
	Via     string   `json:"via,omitempty"`     // endpoint: "r2" (replica 2) or "c1" (remote client 1)
	Err     string   `json:"err,omitempty"`
	Call    int64    `json:"call"`
	Return  int64    `json:"return"` // Open if the outcome is unknown
	Final   bool     `json:"final,omitempty"`
}

// Session is one session's life as its client saw it.
type Session struct {
	ID     uint64 `json:"id"`
	Via    string `json:"via"`
	TTL    int64  `json:"ttl"`    // ns
	Opened int64  `json:"opened"` // NewSession returned
	// Ended is when the client saw the session end (Done closed), 0 if it
	// was alive at the end of the trial.
	Ended int64 `json:"ended,omitempty"`
	// Cause classifies why it ended (see the End* constants).
	Cause string `json:"cause,omitempty"`
	Err   string `json:"err,omitempty"`
	// Deadline is the session's last Deadline(): the send time of its last
	// acknowledged heartbeat + TTL - margin, read after it ended (or at the
	// end of the trial).
	Deadline int64 `json:"deadline"`
	// Margin is the client's safety margin (TTL/10): the cluster may not
	// end the session before Deadline + Margin unless the client closed it.
	Margin int64 `json:"margin"`
	// CloseCall and CloseReturn bound the client's first Close (0: none);
	// CloseOK is whether it returned nil.
	CloseCall   int64  `json:"close_call,omitempty"`
	CloseReturn int64  `json:"close_return,omitempty"`
	CloseOK     bool   `json:"close_ok,omitempty"`
	CloseErr    string `json:"close_err,omitempty"`
	// Abandon is the call time of the earliest operation during which the
	// session ended with an unknown outcome (an acquire that could not be
	// settled, say): the client may have sent a close from then on.
	Abandon int64 `json:"abandon,omitempty"`
	// Gone is when the final check saw the session absent from the
	// cluster's session list (0: not checked, or still listed).
	Gone int64 `json:"gone,omitempty"`
	// ListedAtEnd: listed live by the cluster in the final check.
	ListedAtEnd bool `json:"listed_at_end,omitempty"`
}

// Causes of a session's end, as classified from Session.Err.
const (
	EndClosed    = "closed"             // the client's own Close
	EndProcess   = "process-stopped"    // its replica or client process closed: no close was sent
	EndCluster   = "expired-on-cluster" // the cluster answered that it is gone
	EndLease     = "lease-ran-out"      // no acknowledged heartbeat for TTL - margin; a best-effort close was sent
	EndAbandoned = "abandoned"          // an acquire could not be settled: a best-effort close was sent
	EndOther     = "other"
)

// NoCloseSent reports whether the client sent no close for a session that
// ended with cause: then the cluster may end it only by expiry, a full TTL
// after the send time of its last acknowledged heartbeat.
func NoCloseSent(cause string) bool {
	return cause == EndProcess || cause == EndCluster
}

// Write is one write of a lock holder to the fenced resource: admitted by
// the resource's Fence at Start (Accepted) and finished at End.
type Write struct {
	Lock     string `json:"lock"`
	Session  uint64 `json:"session"`
	Token    uint64 `json:"token"`
	Seq      int    `json:"seq"` // order in which the Fence saw the admissions
	Accepted bool   `json:"accepted"`
	Start    int64  `json:"start"`
	End      int64  `json:"end"`
}

// Fault is one nemesis action as it was carried out.
type Fault struct {
	At     int64  `json:"at"`
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}

// Recovery is one availability measurement: a leader was lost at Lost and
// an acquire succeeded again at Recovered (0: never, within the limit).
type Recovery struct {
	Fault     string `json:"fault"`
	Lost      int64  `json:"lost"`
	Recovered int64  `json:"recovered"`
	// Elected is when a majority first agreed on a new leader (0: not
	// seen), to tell the election from the clients' retries.
	Elected int64 `json:"elected,omitempty"`
	// Bounded: the bound applies (a loss of the leader alone, from a
	// healthy cluster); otherwise the measurement is reported only.
	Bounded bool `json:"bounded"`
}

// History is everything a trial recorded. Its methods are safe for
// concurrent use while the trial runs.
type History struct {
	Seed     uint64            `json:"seed"`
	Config   map[string]string `json:"config"`
	Schedule []string          `json:"schedule"` // the planned fault schedule (a function of the seed)
	Faults   []Fault           `json:"faults"`
	Ops      []Op              `json:"ops"`
	Sessions []*Session        `json:"sessions"`
	Writes   []Write           `json:"writes"`
	Recover  []Recovery        `json:"recoveries"`
	Locks    []string          `json:"locks"`
	// Bound is the availability bound (ns): a recovery longer than this
	// fails the trial.
	Bound int64 `json:"bound"`

	start time.Time
	mu    sync.Mutex
	seq   int
}

// New returns an empty history whose clock starts now.
func New(seed uint64, locks []string) *History {
	return &History{Seed: seed, Config: map[string]string{}, Locks: slices.Clone(locks), start: time.Now()}
}

// Now returns the trial clock: ns since New.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// At converts a monotonic time.Time of this process to the trial clock.
func (h *History) At(t time.Time) int64 { return int64(t.Sub(h.start)) }

// Add records a completed operation and returns its ID.
func (h *History) Add(op Op) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.ID = len(h.Ops)
	h.Ops = append(h.Ops, op)
	return op.ID
}

// AddSession records a session; the caller fills in its end later through
// Update.
func (h *History) AddSession(s *Session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Sessions = append(h.Sessions, s)
}

// Update runs f on the history's records under its lock.
func (h *History) Update(f func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f()
}

// Admit runs the admission admit (the resource's Fence) under the
// history's lock, so that Seq is the order in which the Fence decided, and
// records the write it starts. It returns the write's index for Finish.
func (h *History) Admit(w Write, admit func() bool) (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w.Accepted = admit()
	w.Start = h.Now()
	w.Seq = h.seq
	h.seq++
	w.End = w.Start
	h.Writes = append(h.Writes, w)
	return len(h.Writes) - 1, w.Accepted
}

// Finish records the end of write i.
func (h *History) Finish(i int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Writes[i].End = h.Now()
}

// Fault records a nemesis action now.
func (h *History) Fault(kind, format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Faults = append(h.Faults, Fault{At: h.Now(), Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

// Recovered records an availability measurement.
func (h *History) Recovered(r Recovery) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Recover = append(h.Recover, r)
}

// Save writes the history as indented JSON to path.
func (h *History) Save(path string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	b, err := json.MarshalIndent(h, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// Load reads a history saved by Save.
func Load(path string) (*History, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var h History
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &h, nil
}
