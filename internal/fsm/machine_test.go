package fsm

import (
	"fmt"
	"slices"
	"testing"
)

func TestLimitsDefaults(t *testing.T) {
	want := Limits{
		MaxNameBytes:         256,
		MaxSessions:          1_000_000,
		MaxLocksPerSession:   10_000,
		MaxWaitersPerLock:    10_000,
		MaxPendingPerSession: 1_024,
		MaxValueBytes:        4_096,
		MinTTL:               1e9,
		MaxTTL:               600e9,
	}
	if got := New(Limits{}).Limits(); got != want {
		t.Errorf("zero limits: %+v, want %+v", got, want)
	}
	neg := Limits{-1, -1, -1, -1, -1, -1, -1, -1}
	if got := New(neg).Limits(); got != want {
		t.Errorf("negative limits: %+v, want %+v", got, want)
	}
	set := Limits{1, 2, 3, 4, 5, 6, 7, 8}
	if got := New(set).Limits(); got != set {
		t.Errorf("set limits: %+v, want %+v", got, set)
	}
}

func TestApplyNilCommand(t *testing.T) {
	m := New(Limits{})
	if res, ev := m.Apply(1, 1, nil); res.Code != CodeInvalid || ev != nil || m.Applied() != 1 {
		t.Errorf("Apply(nil) = %+v %+v, applied %d", res, ev, m.Applied())
	}
}

// TestReadsReturnCopies checks that callers cannot change the machine
// through what reads return.
func TestReadsReturnCopies(t *testing.T) {
	m := New(Limits{})
	m.Apply(1, 1, &Command{Op: OpOpenSession, TTL: 10e9})
	m.Apply(2, 1, &Command{Op: OpOpenSession, TTL: 10e9})
	m.Apply(3, 1, &Command{Op: OpAcquire, Session: 1, Seq: 1, Name: "a"})
	m.Apply(4, 1, &Command{Op: OpAcquire, Session: 2, Seq: 1, Name: "a"})
	before := dump(m)
	m.Holder("a").Waiters[0] = 99
	m.SessionLocks(1)[0].Holder = 99
	m.Sessions()[0].ID = 99
	if after := dump(m); after != before {
		t.Errorf("state changed through reads:\n%s\nto\n%s", before, after)
	}
}

func TestExpireKeepsCallersIDs(t *testing.T) {
	m := New(Limits{})
	m.Apply(1, 1, &Command{Op: OpOpenSession, TTL: 10e9})
	ids := []uint64{9, 1, 1, 3}
	m.Apply(2, 1, &Command{Op: OpExpire, Term: 1, IDs: ids})
	if !slices.Equal(ids, []uint64{9, 1, 1, 3}) {
		t.Errorf("Apply changed cmd.IDs to %v", ids)
	}
}

// TestManyLocksPerSession drives a session past smallSet names, where its
// name set becomes a map, and checks that its release on close is still in
// name order, each lock to its first live waiter.
func TestManyLocksPerSession(t *testing.T) {
	m := New(Limits{})
	index := uint64(0)
	apply := func(cmd Command) (Result, []Event) {
		t.Helper()
		index++
		res, ev := m.Apply(index, 1, &cmd)
		if err := checkInvariants(m); err != nil {
			t.Fatalf("index %d %+v: %v", index, cmd, err)
		}
		return res, ev
	}
	owner, _ := apply(Command{Op: OpOpenSession, TTL: 10e9})
	other, _ := apply(Command{Op: OpOpenSession, TTL: 10e9})
	const n = 3 * smallSet
	var names []string
	for i := range n {
		// Acquired in reverse name order, so insertion order is not name order.
		name := fmt.Sprintf("lock-%03d", n-i)
		names = append(names, name)
		if res, _ := apply(Command{Op: OpAcquire, Session: owner.Session, Seq: uint64(i + 1), Name: name}); res.Code != CodeOK {
			t.Fatalf("acquire %s: %+v", name, res)
		}
	}
	if m.sessions[owner.Session].names.set == nil {
		t.Fatalf("name set of %d names is still a list", n)
	}
	slices.Sort(names)
	held := m.SessionLocks(owner.Session)
	if len(held) != n {
		t.Fatalf("SessionLocks: %d locks, want %d", len(held), n)
	}
	for i, li := range held {
		if li.Name != names[i] {
			t.Fatalf("SessionLocks[%d] = %q, want %q", i, li.Name, names[i])
		}
	}
	// The other session waits on every third lock, then gives one up.
	seq := uint64(0)
	var waited []string
	for i := 0; i < n; i += 3 {
		seq++
		if res, _ := apply(Command{Op: OpAcquire, Session: other.Session, Seq: seq, Name: names[i]}); res.Code != CodeQueued {
			t.Fatalf("queue on %s: %+v", names[i], res)
		}
		waited = append(waited, names[i])
	}
	seq++
	apply(Command{Op: OpWithdraw, Session: other.Session, Seq: seq, Name: waited[0]})
	waited = waited[1:]
	// Release a few, then close.
	for i, name := range names[1:4] {
		res, _ := apply(Command{Op: OpRelease, Session: owner.Session, Seq: uint64(n + 1 + i), Name: name, Token: m.Holder(name).Token})
		if res.Code != CodeOK {
			t.Fatalf("release %s: %+v", name, res)
		}
	}
	res, ev := apply(Command{Op: OpCloseSession, Session: owner.Session, Seq: 1000})
	if res.Code != CodeOK {
		t.Fatalf("close: %+v", res)
	}
	var want []Event
	for _, name := range waited {
		if name == names[3] {
			continue // released before the close
		}
		want = append(want, Event{Kind: EventGranted, Session: other.Session, Name: name, Token: index})
	}
	want = append(want, Event{Kind: EventSessionEnded, Session: owner.Session})
	if !slices.Equal(ev, want) {
		t.Errorf("close events:\n%v\nwant\n%v", ev, want)
	}
	if m.NumLocks() != len(waited) {
		t.Errorf("%d locks held, want %d", m.NumLocks(), len(waited))
	}
}

// TestUncontendedApplyAllocs checks that acquiring and releasing a free lock
// allocates nothing once the tables have grown.
func TestUncontendedApplyAllocs(t *testing.T) {
	m := New(Limits{})
	m.Apply(1, 1, &Command{Op: OpOpenSession, TTL: 10e9})
	index, seq := uint64(1), uint64(0)
	acq := Command{Op: OpAcquire, Session: 1, Name: "a"}
	rel := Command{Op: OpRelease, Session: 1, Name: "a"}
	step := func() {
		index++
		seq++
		acq.Seq, acq.Done = seq, seq
		res, _ := m.Apply(index, 1, &acq)
		index++
		seq++
		rel.Seq, rel.Done, rel.Token = seq, seq, res.Token
		if res, _ := m.Apply(index, 1, &rel); res.Code != CodeOK {
			t.Fatalf("release: %+v", res)
		}
	}
	step()
	if allocs := testing.AllocsPerRun(1000, step); allocs != 0 {
		t.Errorf("%.1f allocations per acquire and release", allocs)
	}
}

// TestStampedLimitsDecide: replicas configured with different limits apply
// the same log to the same table when the commands carry their leader's
// limits (Command.Limits; invariant 11). Each stamped limit is checked: a
// lower one refuses, a higher one admits, whatever the machine's own.
func TestStampedLimitsDecide(t *testing.T) {
	low := Limits{MaxNameBytes: 2, MaxSessions: 1, MaxLocksPerSession: 1, MaxWaitersPerLock: 1}
	high := Limits{MaxNameBytes: 300, MaxSessions: 100, MaxLocksPerSession: 100, MaxWaitersPerLock: 100}
	lim := Stamped{MaxNameBytes: 4, MaxSessions: 3, MaxLocksPerSession: 2, MaxWaitersPerLock: 1}
	log := []struct {
		cmd  Command
		want Code
	}{
		{Command{Op: OpOpenSession, TTL: 10e9, Limits: lim}, CodeOK},                          // session 1
		{Command{Op: OpOpenSession, TTL: 10e9, Limits: lim}, CodeOK},                          // session 2
		{Command{Op: OpOpenSession, TTL: 10e9, Limits: lim}, CodeOK},                          // session 3
		{Command{Op: OpOpenSession, TTL: 10e9, Limits: lim}, CodeLimit},                       // MaxSessions 3
		{Command{Op: OpAcquire, Session: 1, Seq: 1, Name: "abcd", Limits: lim}, CodeOK},       // MaxNameBytes 4
		{Command{Op: OpAcquire, Session: 1, Seq: 2, Name: "abcde", Limits: lim}, CodeInvalid}, // over it
		{Command{Op: OpAcquire, Session: 1, Seq: 3, Name: "b", Limits: lim}, CodeOK},          // second lock
		{Command{Op: OpAcquire, Session: 1, Seq: 4, Name: "c", Limits: lim}, CodeLimit},       // MaxLocksPerSession 2
		{Command{Op: OpAcquire, Session: 2, Seq: 1, Name: "b", Limits: lim}, CodeQueued},      // first waiter
		{Command{Op: OpAcquire, Session: 3, Seq: 1, Name: "b", Limits: lim}, CodeLimit},       // MaxWaitersPerLock 1
		{Command{Op: OpAcquire, Session: 3, Seq: 2, Name: "abcd", Limits: lim}, CodeQueued},   // another lock's queue
	}
	var dumps []string
	for _, own := range []Limits{low, high} {
		m := New(own)
		for i, e := range log {
			cmd := e.cmd
			if res, _ := m.Apply(uint64(i+1), 1, &cmd); res.Code != e.want {
				t.Fatalf("own limits %+v, entry %d %+v: code %d, want %d", own, i+1, e.cmd, res.Code, e.want)
			}
		}
		dumps = append(dumps, dump(m))
	}
	if dumps[0] != dumps[1] {
		t.Fatalf("the same log gave different tables:\n%s\n%s", dumps[0], dumps[1])
	}

	// A command without stamps (written before limits were stamped) is
	// checked against the machine's own limits.
	m := New(low)
	m.Apply(1, 1, &Command{Op: OpOpenSession, TTL: 10e9})
	if res, _ := m.Apply(2, 1, &Command{Op: OpOpenSession, TTL: 10e9}); res.Code != CodeLimit {
		t.Fatalf("an unstamped open over the machine's MaxSessions 1: code %d", res.Code)
	}
	if res, _ := m.Apply(3, 1, &Command{Op: OpAcquire, Session: 1, Seq: 1, Name: "abc"}); res.Code != CodeInvalid {
		t.Fatalf("an unstamped acquire over the machine's MaxNameBytes 2: code %d", res.Code)
	}
}

// A listing cursor at the largest ID has nothing after it: after+1 must not
// wrap around to the first session (a bad cursor from a remote client).
func TestSessionsAfterLargestID(t *testing.T) {
	m := New(Limits{})
	m.Apply(1, 1, &Command{Op: OpOpenSession, TTL: 10e9})
	m.Apply(2, 1, &Command{Op: OpOpenSession, TTL: 10e9})
	if out, more := m.SessionsAfter(^uint64(0), 10); len(out) != 0 || more {
		t.Errorf("SessionsAfter(max) = %+v, %v; want none", out, more)
	}
	if out, more := m.SessionsAfter(^uint64(0)-1, 10); len(out) != 0 || more {
		t.Errorf("SessionsAfter(max-1) = %+v, %v; want none", out, more)
	}
	if out, _ := m.SessionsAfter(1, 10); len(out) != 1 || out[0].ID != 2 {
		t.Errorf("SessionsAfter(1) = %+v, want session 2", out)
	}
}
