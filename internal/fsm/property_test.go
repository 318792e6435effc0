package fsm

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// TestProperties drives two Machines with the same random log, one through
// Apply and one through Encode and ApplyEntry, and checks after every entry:
//
//   - determinism: identical results, events and state (the two machines'
//     maps iterate in different orders);
//   - the structural invariants of checkInvariants: at most one holder per
//     lock, every holder and waiter a live session, no session both holding
//     and waiting for one lock;
//   - every new grant has the entry's index as token, higher than every
//     earlier grant of that lock, and goes to the first waiter that lives
//     on (FIFO, invariant 8), with an EventGranted unless it is the
//     session's own acquire of a free lock;
//   - fencing: a release succeeds only with the current grant's token;
//   - dedupe: a command whose (session, seq) was applied before returns the
//     remembered outcome (or the current state of a queued acquire), or
//     CodeInvalid once retired, or CodeNoSession once the session ended, and
//     changes nothing; an acquire taken back by a withdraw's Target before
//     it arrived answers withdrawn and changes nothing;
//   - an entry at or below Applied() changes nothing, and reads change
//     nothing.
func TestProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		lim := Limits{
			MaxNameBytes:         4,
			MaxSessions:          rapid.IntRange(1, 6).Draw(rt, "maxSessions"),
			MaxLocksPerSession:   rapid.SampledFrom([]int{1, 2, 3, 40}).Draw(rt, "maxLocksPerSession"),
			MaxWaitersPerLock:    rapid.IntRange(1, 6).Draw(rt, "maxWaitersPerLock"),
			MaxPendingPerSession: rapid.IntRange(1, 6).Draw(rt, "maxPendingPerSession"),
		}
		// Few names for contention, or many, so that a session's name set
		// outgrows smallSet.
		var names []string
		for i := range rapid.SampledFrom([]int{1, 2, 3, 5, 40}).Draw(rt, "names") {
			names = append(names, fmt.Sprintf("n%d", i))
		}
		h := &harness{
			a:          New(lim),
			b:          New(lim),
			names:      names,
			term:       1,
			nextSeq:    map[uint64]uint64{},
			remembered: map[[2]uint64]remembered{},
			lastGrant:  map[string]uint64{},
		}
		steps := rapid.IntRange(1, 600).Draw(rt, "steps")
		for range steps {
			h.step(rt)
		}
	})
}

// invalidNames fail ValidName with MaxNameBytes 4.
var invalidNames = []string{"", "n\x00", "toolong", "\xff"}

type remembered struct {
	name string
	res  Result
}

type harness struct {
	a, b       *Machine
	names      []string
	index      uint64
	term       uint64
	opened     []uint64 // every session ever opened
	nextSeq    map[uint64]uint64
	remembered map[[2]uint64]remembered
	lastGrant  map[string]uint64
	untracked  bool        // a garbage entry decoded to a command
	skipped    [][2]uint64 // (session, seq) of acquires taken back before sent
}

func (h *harness) step(rt *rapid.T) {
	switch kind := rapid.IntRange(0, 99).Draw(rt, "kind"); {
	case kind < 3:
		h.term += uint64(rapid.IntRange(1, 2).Draw(rt, "termBump"))
		return
	case kind < 5:
		h.index += uint64(rapid.IntRange(1, 3).Draw(rt, "noopGap"))
		h.a.SetApplied(h.index)
		h.b.SetApplied(h.index)
		return
	case kind < 7:
		h.stale(rt)
		return
	case kind < 9:
		h.garbage(rt)
		return
	case kind < 11:
		// Machine b continues from a snapshot of itself: a restored
		// machine must be indistinguishable from the one that wrote it.
		h.b = roundTrip(rt, h.b)
		checkSessionOrder(rt, h.b)
		return
	}
	cmd := h.command(rt)
	h.index += uint64(rapid.IntRange(1, 2).Draw(rt, "gap"))
	h.apply(rt, &cmd)
}

// command draws a command, mostly well-formed and for live sessions.
func (h *harness) command(rt *rapid.T) Command {
	op := rapid.SampledFrom([]Op{
		OpOpenSession, OpOpenSession,
		OpAcquire, OpAcquire, OpAcquire, OpAcquire, OpAcquire, OpAcquire, OpAcquire, OpAcquire,
		OpRelease, OpRelease, OpRelease, OpRelease, OpRelease,
		OpWithdraw, OpWithdraw,
		OpCloseSession, OpExpire, Op(0), OpProclaim, OpRevoke,
	}).Draw(rt, "op")
	cmd := Command{Op: op}
	switch op {
	case OpOpenSession:
		cmd.TTL = rapid.SampledFrom([]int64{10e9, 10e9, 10e9, 0, 700e9}).Draw(rt, "ttl")
		cmd.Nonce = rapid.Uint64().Draw(rt, "nonce")
		// A few open IDs, so that retried opens meet live sessions.
		cmd.OpenID = rapid.SampledFrom([]uint64{0, 0, 1, 2, 3}).Draw(rt, "openID")
		return cmd
	case OpRevoke:
		if len(h.opened) > 0 {
			cmd.IDs = rapid.SliceOfN(rapid.SampledFrom(h.opened), 0, 3).Draw(rt, "ids")
		}
		return cmd
	case OpExpire:
		cmd.Term = h.term
		if rapid.IntRange(0, 4).Draw(rt, "staleTerm") == 0 {
			cmd.Term = h.term - 1 + uint64(rapid.IntRange(0, 1).Draw(rt, "off"))*2
		}
		if len(h.opened) > 0 {
			cmd.IDs = rapid.SliceOfN(rapid.SampledFrom(h.opened), 0, 4).Draw(rt, "ids")
		}
		return cmd
	}
	cmd.Session = 12345 // never opened
	live := h.a.Sessions()
	switch pick := rapid.IntRange(0, 99).Draw(rt, "pickSession"); {
	case pick < 90 && len(live) > 0:
		cmd.Session = rapid.SampledFrom(live).Draw(rt, "session").ID
	case pick < 97 && len(h.opened) > 0:
		cmd.Session = rapid.SampledFrom(h.opened).Draw(rt, "session")
	}
	next := h.nextSeq[cmd.Session] + 1
	if rapid.IntRange(0, 3).Draw(rt, "retry") == 0 {
		cmd.Seq = rapid.Uint64Range(0, next).Draw(rt, "seq")
	} else {
		cmd.Seq = next
	}
	if op == OpWithdraw && rapid.IntRange(0, 2).Draw(rt, "target") == 0 {
		if rapid.Bool().Draw(rt, "ahead") {
			// Take back an acquire that has not been sent yet.
			cmd.Seq = next + 1
			cmd.Target = next
			h.skipped = append(h.skipped, [2]uint64{cmd.Session, next})
		} else {
			cmd.Target = rapid.Uint64Range(0, cmd.Seq+1).Draw(rt, "targetSeq")
		}
	}
	h.nextSeq[cmd.Session] = max(h.nextSeq[cmd.Session], cmd.Seq)
	cmd.Done = rapid.Uint64Range(0, cmd.Seq+1).Draw(rt, "done")
	cmd.Name = rapid.SampledFrom(h.names).Draw(rt, "name")
	if rapid.IntRange(0, 9).Draw(rt, "invalidName") == 0 {
		cmd.Name = rapid.SampledFrom(invalidNames).Draw(rt, "name")
	}
	switch op {
	case OpAcquire:
		if len(h.skipped) > 0 && rapid.IntRange(0, 3).Draw(rt, "late") == 0 {
			// The acquire a withdraw took back arrives after it.
			i := rapid.IntRange(0, len(h.skipped)-1).Draw(rt, "skipped")
			cmd.Session, cmd.Seq = h.skipped[i][0], h.skipped[i][1]
			cmd.Done = 0
			h.skipped = slices.Delete(h.skipped, i, i+1)
		}
		cmd.Try = rapid.IntRange(0, 4).Draw(rt, "try") == 0
		cmd.Value = rapid.SampledFrom([][]byte{nil, nil, []byte("v1"), []byte("v2")}).Draw(rt, "value")
	case OpRelease, OpProclaim:
		if held := h.a.SessionLocks(cmd.Session); len(held) > 0 && rapid.IntRange(0, 9).Draw(rt, "releaseHeld") < 7 {
			cmd.Name = rapid.SampledFrom(held).Draw(rt, "held").Name
		}
		cmd.Token = h.a.Holder(cmd.Name).Token
		if rapid.IntRange(0, 3).Draw(rt, "staleToken") == 0 {
			cmd.Token = rapid.Uint64Range(0, h.index+1).Draw(rt, "token")
		}
		if op == OpProclaim {
			cmd.Value = rapid.SampledFrom([][]byte{nil, []byte("p1"), []byte("p2")}).Draw(rt, "value")
		}
	}
	if cmd.Seq > 0 && rapid.Bool().Draw(rt, "listed") {
		// Some other requests in flight below Seq; every other seq below
		// is retired.
		cmd.Listed = true
		for range rapid.IntRange(0, 3).Draw(rt, "pending") {
			cmd.Pending = append(cmd.Pending, rapid.Uint64Range(0, cmd.Seq-1).Draw(rt, "pendingSeq"))
		}
		slices.Sort(cmd.Pending)
		cmd.Pending = slices.Compact(cmd.Pending)
		if len(cmd.Pending) == 0 {
			cmd.Pending = nil
		}
	}
	return cmd
}

func (h *harness) apply(rt *rapid.T, cmd *Command) {
	before := make(map[string]LockInfo, len(h.names))
	for _, n := range h.names {
		before[n] = h.a.Holder(n)
	}
	stateBefore := dumpState(h.a)
	key := [2]uint64{cmd.Session, cmd.Seq}
	prior, isRetry := h.remembered[key]
	targetApplied, dup := true, false
	if s := h.a.sessions[cmd.Session]; s != nil {
		if cmd.Op == OpWithdraw && cmd.Target != 0 {
			_, targetApplied = s.find(cmd.Target)
		}
		_, dup = s.find(cmd.Seq)
	}
	isRetry = isRetry && cmd.Op != OpOpenSession && cmd.Op != OpExpire
	var reopens uint64 // the live session a retried open returns
	if cmd.Op == OpOpenSession && cmd.OpenID != 0 {
		reopens = h.a.opens[cmd.OpenID]
	}

	resA, evA := h.a.Apply(h.index, h.term, cmd)
	decoded, resB, evB := h.b.ApplyEntry(h.index, h.term, Encode(cmd))
	h.compare(rt, resA, evA, resB, evB)
	if cmd.Op >= OpOpenSession && cmd.Op <= OpRevoke && !equalCommand(decoded, normalized(cmd)) {
		rt.Fatalf("decoded %+v, encoded %+v", decoded, *cmd)
	}
	if h.a.Applied() != h.index {
		rt.Fatalf("applied %d after index %d", h.a.Applied(), h.index)
	}
	if err := checkInvariants(h.a); err != nil {
		rt.Fatalf("index %d %+v: %v", h.index, *cmd, err)
	}
	afterApply := dump(h.a)
	defer func() {
		if dump(h.a) != afterApply {
			rt.Fatalf("reads changed the state")
		}
	}()
	h.checkHolders(rt)
	// A command that names one lock changes no other lock's holder, token
	// or value, and opening a session changes none: the service notifies
	// only that lock's watchers after it (service.notifyApplied).
	switch cmd.Op {
	case OpOpenSession, OpAcquire, OpRelease, OpWithdraw, OpProclaim:
		for _, n := range h.names {
			if n == cmd.Name && cmd.Op != OpOpenSession {
				continue
			}
			if a, b := before[n], h.a.Holder(n); a.Holder != b.Holder || a.Token != b.Token || string(a.Value) != string(b.Value) {
				rt.Fatalf("%v of %q changed lock %q from %+v to %+v", cmd.Op, cmd.Name, n, a, b)
			}
		}
	}

	// An open whose OpenID names a live session returns it, creates
	// nothing, or fails CodeInvalid for another TTL.
	if cmd.Op == OpOpenSession && reopens != 0 {
		if resA.Code == CodeOK && resA.Session != reopens {
			rt.Fatalf("open with open ID %d of session %d returned %+v", cmd.OpenID, reopens, resA)
		}
		if resA.Code != CodeOK && resA.Code != CodeInvalid {
			rt.Fatalf("open with open ID %d of session %d: %+v", cmd.OpenID, reopens, resA)
		}
		if got := dumpState(h.a); got != stateBefore {
			rt.Fatalf("retried open changed the state from\n%s\nto\n%s", stateBefore, got)
		}
	} else if cmd.Op == OpOpenSession && resA.Code == CodeOK {
		if resA.Session != h.index {
			rt.Fatalf("session %d opened at index %d", resA.Session, h.index)
		}
		h.opened = append(h.opened, resA.Session)
	}

	// Grants: each new one is to a waiter, with the entry's index as token,
	// above every earlier token of the lock.
	granted := map[string]bool{}
	for _, e := range evA {
		if e.Kind != EventGranted {
			continue
		}
		// FIFO: the first waiter whose session lives on gets the lock.
		var first uint64
		for _, w := range before[e.Name].Waiters {
			if _, live := h.a.Session(w); live {
				first = w
				break
			}
		}
		if e.Token != h.index || e.Session != first {
			rt.Fatalf("grant %+v at index %d; before: %+v", e, h.index, before[e.Name])
		}
		granted[e.Name] = true
	}
	for _, n := range h.names {
		after := h.a.Holder(n)
		if after.Holder == 0 || (after.Holder == before[n].Holder && after.Token == before[n].Token) {
			continue
		}
		if after.Token != h.index || after.Token <= h.lastGrant[n] {
			rt.Fatalf("lock %q granted with token %d at index %d, last grant %d", n, after.Token, h.index, h.lastGrant[n])
		}
		h.lastGrant[n] = after.Token
		ownAcquire := cmd.Op == OpAcquire && cmd.Session == after.Holder && cmd.Name == n &&
			resA.Code == CodeOK && before[n].Holder == 0
		if !granted[n] && !ownAcquire {
			rt.Fatalf("lock %q granted to %d without an event: %+v", n, after.Holder, *cmd)
		}
	}

	// Fencing (invariant 7): only the current grant's token releases.
	if cmd.Op == OpRelease && !dup && resA.Code == CodeOK {
		if b := before[cmd.Name]; b.Holder != cmd.Session || b.Token != cmd.Token || resA.Token != cmd.Token {
			rt.Fatalf("release %+v returned %+v; lock was %+v", *cmd, resA, b)
		}
	}

	if h.untracked {
		return
	}
	if isRetry {
		h.checkRetry(rt, cmd, prior, resA, stateBefore)
	} else if (cmd.Op >= OpAcquire && cmd.Op <= OpWithdraw || cmd.Op == OpProclaim) &&
		resA.Code != CodeLimit && resA.Code != CodeInvalid && resA.Code != CodeNoSession {
		r := remembered{res: resA}
		if resA.Code == CodeQueued {
			r.name = cmd.Name
		}
		h.remembered[key] = r
		if s := h.a.sessions[cmd.Session]; s != nil && cmd.Op == OpWithdraw && cmd.Target != 0 && !targetApplied && !s.retired(cmd.Target) {
			// Pre-empted: the acquire with Seq Target must take no effect.
			h.remembered[[2]uint64{cmd.Session, cmd.Target}] = remembered{res: Result{Code: CodeWithdrawn}}
		}
	}
}

// checkRetry checks a command whose (session, seq) had a remembered outcome.
func (h *harness) checkRetry(rt *rapid.T, cmd *Command, prior remembered, res Result, stateBefore string) {
	if stateAfter := dumpState(h.a); stateAfter != stateBefore {
		rt.Fatalf("retry %+v (first: %+v) changed the state:\n%s\nto\n%s", *cmd, prior, stateBefore, stateAfter)
	}
	switch res.Code {
	case CodeInvalid, CodeNoSession:
		return // retired, or the session ended
	}
	if prior.res.Code != CodeQueued {
		if res != prior.res {
			rt.Fatalf("retry %+v returned %+v, first %+v", *cmd, res, prior.res)
		}
		return
	}
	li := h.a.Holder(prior.name)
	waiting := slices.Contains(li.Waiters, cmd.Session)
	var want Result
	switch {
	case li.Holder == cmd.Session:
		want = Result{Code: CodeOK, Token: li.Token}
	case waiting:
		want = Result{Code: CodeQueued}
	default:
		want = Result{Code: CodeWithdrawn}
	}
	if res != want {
		rt.Fatalf("retry of queued acquire %+v returned %+v, want %+v (lock %+v)", *cmd, res, want, li)
	}
}

// checkSessionOrder checks that the ordered session list matches the
// session map: every live session once, in increasing ID order, and the
// count of dead slots right.
func checkSessionOrder(rt *rapid.T, m *Machine) {
	live, dead, prev := 0, 0, uint64(0)
	for _, r := range m.order {
		if r.id <= prev {
			rt.Fatalf("session order not increasing: %d after %d", r.id, prev)
		}
		prev = r.id
		if r.s == nil {
			dead++
			continue
		}
		live++
		if m.sessions[r.id] != r.s {
			rt.Fatalf("session %d in order is not the live one", r.id)
		}
	}
	if live != len(m.sessions) || dead != m.dead {
		rt.Fatalf("order has %d live and %d dead slots; %d sessions, %d dead counted", live, dead, len(m.sessions), m.dead)
	}
}

// checkHolders checks the read API against itself: every held lock appears
// in exactly its holder's SessionLocks.
func (h *harness) checkHolders(rt *rapid.T) {
	checkSessionOrder(rt, h.a)
	checkSessionOrder(rt, h.b)
	n := 0
	for _, s := range h.a.Sessions() {
		for _, li := range h.a.SessionLocks(s.ID) {
			n++
			if li.Holder != s.ID || !reflect.DeepEqual(h.a.Holder(li.Name), li) {
				rt.Fatalf("session %d lists %+v, Holder says %+v", s.ID, li, h.a.Holder(li.Name))
			}
		}
	}
	if n != h.a.NumLocks() {
		rt.Fatalf("sessions hold %d locks, NumLocks %d", n, h.a.NumLocks())
	}
}

// stale applies a command at an index at or below Applied(): it must be
// rejected without any change.
func (h *harness) stale(rt *rapid.T) {
	if h.index == 0 {
		return
	}
	cmd := h.command(rt)
	index := rapid.Uint64Range(0, h.index).Draw(rt, "staleIndex")
	before := dump(h.a)
	res, ev := h.a.Apply(index, h.term, &cmd)
	_, resB, evB := h.b.ApplyEntry(index, h.term, Encode(&cmd))
	h.compare(rt, res, ev, resB, evB)
	if res.Code != CodeInvalid || len(ev) != 0 || dump(h.a) != before {
		rt.Fatalf("stale index %d (applied %d) took effect: %+v %+v", index, h.index, res, ev)
	}
}

// garbage applies random bytes to both machines, through ApplyEntry.
func (h *harness) garbage(rt *rapid.T) {
	data := rapid.SliceOfN(rapid.Byte(), 0, 12).Draw(rt, "garbage")
	if rapid.Bool().Draw(rt, "versioned") {
		data = append([]byte{formatV1}, data...)
	}
	h.index++
	cmdA, resA, evA := h.a.ApplyEntry(h.index, h.term, data)
	cmdB, resB, evB := h.b.ApplyEntry(h.index, h.term, data)
	h.compare(rt, resA, evA, resB, evB)
	if !equalCommand(cmdA, cmdB) {
		rt.Fatalf("decoded differently: %+v %+v", cmdA, cmdB)
	}
	if err := checkInvariants(h.a); err != nil {
		rt.Fatalf("index %d garbage %x: %v", h.index, data, err)
	}
	if cmdA.Op != 0 {
		// A valid command, whose effect this harness does not track:
		// stop checking retries.
		h.untracked = true
	}
	for _, n := range h.names {
		if tok := h.a.Holder(n).Token; tok > h.lastGrant[n] {
			h.lastGrant[n] = tok
		}
	}
	for _, s := range h.a.Sessions() {
		if !slices.Contains(h.opened, s.ID) {
			h.opened = append(h.opened, s.ID)
		}
	}
}

func (h *harness) compare(rt *rapid.T, resA Result, evA []Event, resB Result, evB []Event) {
	if resA != resB || !slices.Equal(evA, evB) {
		rt.Fatalf("machines disagree at index %d: %+v %+v vs %+v %+v", h.index, resA, evA, resB, evB)
	}
	if da, db := dump(h.a), dump(h.b); da != db {
		rt.Fatalf("machines disagree at index %d:\n%s\nvs\n%s", h.index, da, db)
	}
}

// dumpState is dump without the applied index.
func dumpState(m *Machine) string {
	s := dump(m)
	_, rest, _ := strings.Cut(s, "\n")
	return rest
}

// normalized returns cmd with only the fields that its Op encodes.
func normalized(cmd *Command) Command {
	out := Command{Op: cmd.Op}
	switch cmd.Op {
	case OpOpenSession:
		out.TTL, out.Nonce, out.OpenID = cmd.TTL, cmd.Nonce, cmd.OpenID
	case OpAcquire, OpRelease, OpWithdraw, OpCloseSession, OpProclaim:
		out.Session, out.Seq, out.Done = cmd.Session, cmd.Seq, cmd.Done
		out.Listed, out.Pending = cmd.Listed, cmd.Pending
		if cmd.Op != OpCloseSession {
			out.Name = cmd.Name
		}
		out.Try = cmd.Op == OpAcquire && cmd.Try
		if cmd.Op == OpRelease || cmd.Op == OpProclaim {
			out.Token = cmd.Token
		}
		if (cmd.Op == OpAcquire || cmd.Op == OpProclaim) && len(cmd.Value) > 0 {
			out.Value = cmd.Value
		}
		if cmd.Op == OpWithdraw {
			out.Target = cmd.Target
		}
	case OpExpire:
		out.Term, out.IDs = cmd.Term, cmd.IDs
	case OpRevoke:
		out.IDs, out.Nonce = cmd.IDs, cmd.Nonce
	}
	return out
}
