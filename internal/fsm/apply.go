package fsm

import (
	"math"
	"slices"
)

// Apply applies the command of the committed entry at (index, term) and
// returns its result and the events it caused, in a deterministic order (nil
// when none). Apply does not retain cmd.
//
// Entries must be applied in log order. The index of each command must be
// above Applied(): a command whose index is at or below it is rejected with
// CodeInvalid and changes nothing (Applied() included), so a replayed entry can
// never hand out a token lower than one already granted (DESIGN.md invariant
// 2). Otherwise Applied() becomes index, whatever the result. A nil cmd or an
// unknown Op yields CodeInvalid.
//
// The outcome of each Op is documented on the Op constants and in this
// package's tests (testdata/*.txt); in short:
//
//  1. OpOpenSession creates session index (Result.Session). TTL outside
//     [MinTTL, MaxTTL]: CodeInvalid. A non-zero OpenID that names a live
//     session (one opened with it) with the same TTL: CodeOK with that
//     session's ID, and nothing changes (no MaxSessions check: no session is
//     added); with another TTL: CodeInvalid (the client's lease would not
//     match the session's). MaxSessions live sessions: CodeLimit.
//  2. OpAcquire, OpRelease, OpWithdraw and OpCloseSession act for
//     cmd.Session: CodeNoSession if it does not exist. They are deduplicated
//     by cmd.Seq (invariant 6): Seq 0 or Seq below the session's Done is
//     CodeInvalid; a Seq applied before returns its remembered outcome and
//     changes nothing, except that an acquire remembered as CodeQueued
//     reports its current state (CodeOK with the token if the session holds
//     the lock now, CodeQueued if it still waits, CodeWithdrawn otherwise).
//     Then outcomes of sequence numbers below min(Done, Seq) are forgotten;
//     a command that would leave more than MaxPendingPerSession remembered
//     outcomes fails with CodeLimit and changes nothing. OpCloseSession is
//     exempt from that limit, and its outcome is not remembered: a retried
//     close finds no session (CodeNoSession).
//  3. OpAcquire: CodeInvalid for a name that fails ValidName; CodeOK with
//     the current token if the session already holds the lock, CodeQueued if
//     it already waits; a free lock is granted (CodeOK, Token = index); a
//     held one yields CodeLocked for Try, CodeLimit if the lock's queue or
//     the session's locks (held plus waited) are at their limit, else the
//     session joins the FIFO queue (CodeQueued). Granting a free lock also
//     counts against MaxLocksPerSession.
//  4. OpRelease frees the lock if the session holds it under exactly
//     cmd.Token (CodeOK, Token = the released token) and grants it to the
//     first waiter (EventGranted, Token = index); anything else is
//     CodeNotHeld and changes nothing (invariant 7).
//  5. OpWithdraw: a waiting session leaves the queue (CodeWithdrawn); a
//     holder gets CodeOK with its token and keeps the lock; otherwise
//     CodeWithdrawn. A non-zero Target must be below Seq (else
//     CodeInvalid); if no outcome is remembered for Seq Target and Target
//     is not retired, CodeWithdrawn is remembered for it, so the acquire
//     with that Seq, should it arrive later, takes no effect. That outcome
//     counts against MaxPendingPerSession.
//  6. OpCloseSession and OpExpire end sessions: see endSessions. OpExpire is
//     CodeStaleTerm and changes nothing unless cmd.Term == term.
//
// Apply never panics and allocates nothing on the path of an uncontended
// acquire or release beyond amortised growth of its tables.
func (m *Machine) Apply(index, term uint64, cmd *Command) (Result, []Event) {
	if index <= m.applied {
		return Result{Code: CodeInvalid}, nil
	}
	m.applied = index
	if cmd == nil {
		return Result{Code: CodeInvalid}, nil
	}
	switch cmd.Op {
	case OpOpenSession:
		return m.openSession(index, cmd), nil
	case OpAcquire, OpRelease, OpWithdraw, OpCloseSession, OpProclaim:
		return m.applySession(index, cmd)
	case OpExpire:
		return m.expire(index, term, cmd)
	case OpRevoke:
		return m.expire(index, term, &Command{Op: OpExpire, Term: term, IDs: cmd.IDs})
	}
	return Result{Code: CodeInvalid}, nil
}

// ApplyEntry decodes data (as written by Encode) and applies it like Apply,
// returning the decoded command with the result and events. Data that Decode
// rejects yields a zero Command and CodeInvalid, and changes nothing but
// Applied() (which becomes index, if above it): a corrupt command is a
// deterministic outcome on every replica, not a reason to stop.
func (m *Machine) ApplyEntry(index, term uint64, data []byte) (Command, Result, []Event) {
	var cmd Command
	if err := Decode(data, &cmd); err != nil {
		m.SetApplied(index)
		return Command{}, Result{Code: CodeInvalid}, nil
	}
	res, ev := m.Apply(index, term, &cmd)
	return cmd, res, ev
}

func (m *Machine) openSession(index uint64, cmd *Command) Result {
	if cmd.TTL < m.lim.MinTTL || cmd.TTL > m.lim.MaxTTL {
		return Result{Code: CodeInvalid}
	}
	if cmd.OpenID != 0 {
		if id, ok := m.opens[cmd.OpenID]; ok {
			// A retry of the open that created id (its answer was lost or
			// late): the same session, not a second one.
			if m.sessions[id].ttl != cmd.TTL {
				return Result{Code: CodeInvalid}
			}
			return Result{Code: CodeOK, Session: id}
		}
	}
	if len(m.sessions) >= stampedLimit(cmd.Limits.MaxSessions, m.lim.MaxSessions) {
		return Result{Code: CodeLimit}
	}
	// Session IDs are indexes, and Apply only accepts indexes above every
	// earlier one, so index is not a live session's ID.
	m.addSession(index, &session{ttl: cmd.TTL, openID: cmd.OpenID})
	return Result{Code: CodeOK, Session: index}
}

// applySession runs the dedupe protocol of invariant 6 around the commands
// that act for one session.
func (m *Machine) applySession(index uint64, cmd *Command) (Result, []Event) {
	id := cmd.Session
	s, ok := m.sessions[id]
	if !ok {
		return Result{Code: CodeNoSession}, nil
	}
	if cmd.Seq == 0 || s.retired(cmd.Seq) {
		return Result{Code: CodeInvalid}, nil
	}
	if at, dup := s.find(cmd.Seq); dup {
		return m.replay(id, s, &s.outcomes[at]), nil
	}
	if cmd.Op == OpWithdraw && cmd.Target >= cmd.Seq && cmd.Target != 0 {
		// An acquire is taken back by a later request of its session.
		return Result{Code: CodeInvalid}, nil
	}

	// The client has every response below Done, but never forget this
	// command's own outcome: it is remembered below.
	done := min(cmd.Done, cmd.Seq)
	if cmd.Op == OpCloseSession {
		// Ending the session drops its whole table: no limit, no memory.
		return Result{Code: CodeOK}, m.endSessions(index, []uint64{id})
	}
	r := s.plan(cmd.Seq, done, cmd.Listed, cmd.Pending)
	keep := []uint64{cmd.Seq}
	preempt := cmd.Op == OpWithdraw && cmd.Target != 0 && !r.retires(cmd.Target)
	if preempt {
		if _, applied := s.find(cmd.Target); applied {
			preempt = false
		} else {
			keep = append(keep, cmd.Target)
		}
	}
	if s.entries(&r, keep...) > m.lim.MaxPendingPerSession {
		return Result{Code: CodeLimit}, nil
	}
	s.retire(r)

	var (
		res Result
		ev  []Event
	)
	switch cmd.Op {
	case OpAcquire:
		res = m.acquire(index, id, s, cmd)
	case OpProclaim:
		res = m.proclaim(id, cmd)
	case OpRelease:
		res, ev = m.release(index, id, s, cmd.Name, cmd.Token)
	case OpWithdraw:
		res = m.withdraw(id, s, cmd.Name)
		if preempt {
			// The target acquire is not applied yet: when it arrives it
			// finds this outcome and takes no effect.
			s.remember(outcome{seq: cmd.Target, code: CodeWithdrawn})
		}
	}
	o := outcome{seq: cmd.Seq, code: res.Code, token: res.Token}
	if res.Code == CodeQueued {
		o.name = cmd.Name
	}
	s.remember(o)
	return res, ev
}

// replay returns the outcome of a duplicate command.
func (m *Machine) replay(id uint64, s *session, o *outcome) Result {
	if o.code != CodeQueued {
		return Result{Code: o.code, Token: o.token}
	}
	if l, ok := m.locks.lookup(o.name); ok && l.holder == id {
		return Result{Code: CodeOK, Token: l.token}
	}
	if s.names.has(o.name) {
		return Result{Code: CodeQueued}
	}
	return Result{Code: CodeWithdrawn}
}

func (m *Machine) acquire(index, id uint64, s *session, cmd *Command) Result {
	name, try := cmd.Name, cmd.Try
	maxLocks := stampedLimit(cmd.Limits.MaxLocksPerSession, m.lim.MaxLocksPerSession)
	if !ValidKey(name, stampedLimit(cmd.Limits.MaxNameBytes, m.lim.MaxNameBytes)) || len(cmd.Value) > m.lim.MaxValueBytes {
		return Result{Code: CodeInvalid}
	}
	l, held := m.locks.lookup(name)
	if !held {
		if s.names.len() >= maxLocks {
			return Result{Code: CodeLimit}
		}
		m.locks.set(name, lock{holder: id, token: index})
		if len(cmd.Value) > 0 {
			m.values[name] = slices.Clone(cmd.Value)
		}
		s.names.add(name)
		return Result{Code: CodeOK, Token: index}
	}
	if l.holder == id {
		return Result{Code: CodeOK, Token: l.token}
	}
	if bugDoubleGrant && index%2 == 0 && !s.names.has(name) {
		// The deliberate bug of a build with the tag fsmbug (bug_on.go).
		m.locks.set(name, lock{holder: id, token: index})
		s.names.add(name)
		return Result{Code: CodeOK, Token: index}
	}
	// The session is not the holder, so a lock in its names is one it waits
	// for.
	if s.names.has(name) {
		return Result{Code: CodeQueued}
	}
	if try {
		return Result{Code: CodeLocked}
	}
	q := m.queues[name]
	if len(q) >= stampedLimit(cmd.Limits.MaxWaitersPerLock, m.lim.MaxWaitersPerLock) || s.names.len() >= maxLocks {
		return Result{Code: CodeLimit}
	}
	m.queues[name] = append(q, id)
	if len(cmd.Value) > 0 {
		m.waitValues[waitKey{name, id}] = slices.Clone(cmd.Value)
	}
	s.names.add(name)
	return Result{Code: CodeQueued}
}

func (m *Machine) proclaim(id uint64, cmd *Command) Result {
	l, ok := m.locks.lookup(cmd.Name)
	if !ok || l.holder != id || l.token != cmd.Token {
		return Result{Code: CodeNotHeld}
	}
	if len(cmd.Value) > m.lim.MaxValueBytes {
		return Result{Code: CodeInvalid}
	}
	if len(cmd.Value) == 0 {
		delete(m.values, cmd.Name)
	} else {
		m.values[cmd.Name] = slices.Clone(cmd.Value)
	}
	return Result{Code: CodeOK, Token: l.token}
}

func (m *Machine) release(index, id uint64, s *session, name string, token uint64) (Result, []Event) {
	l, ok := m.locks.lookup(name)
	if !ok || l.holder != id || l.token != token {
		return Result{Code: CodeNotHeld}, nil
	}
	s.names.remove(name)
	var ev []Event
	if e, granted := m.handOff(index, name); granted {
		ev = []Event{e}
	}
	return Result{Code: CodeOK, Token: token}, ev
}

func (m *Machine) withdraw(id uint64, s *session, name string) Result {
	l, ok := m.locks.lookup(name)
	if !ok {
		return Result{Code: CodeWithdrawn}
	}
	if l.holder == id {
		return Result{Code: CodeOK, Token: l.token}
	}
	if s.names.has(name) {
		s.names.remove(name)
		m.setQueue(name, slices.DeleteFunc(m.queues[name], func(w uint64) bool { return w == id }))
		delete(m.waitValues, waitKey{name, id})
	}
	return Result{Code: CodeWithdrawn}
}

// handOff frees the lock called name and grants it to its first waiter with
// token index, or deletes it if nobody waits. It reports the grant. Callers
// keep every waiter a live session (invariant 8).
func (m *Machine) handOff(index uint64, name string) (Event, bool) {
	q := m.queues[name]
	delete(m.values, name)
	if len(q) == 0 {
		m.locks.del(name)
		return Event{}, false
	}
	next := q[0]
	m.setQueue(name, q[1:])
	token := index
	if bugTokenReuse {
		// The deliberate bug of a build with the tag fsmbug (bug_on.go).
		token = m.locks.get(name).token
	}
	m.locks.set(name, lock{holder: next, token: token})
	if v, ok := m.waitValues[waitKey{name, next}]; ok {
		m.values[name] = v
		delete(m.waitValues, waitKey{name, next})
	}
	return Event{Kind: EventGranted, Session: next, Name: name, Token: token}, true
}

// setQueue stores q as the queue of name, or drops the queue when q is
// empty.
func (m *Machine) setQueue(name string, q []uint64) {
	if len(q) == 0 {
		delete(m.queues, name)
		return
	}
	m.queues[name] = q
}

func (m *Machine) expire(index, term uint64, cmd *Command) (Result, []Event) {
	if cmd.Term != term {
		return Result{Code: CodeStaleTerm}, nil
	}
	ids := slices.Clone(cmd.IDs)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	ids = slices.DeleteFunc(ids, func(id uint64) bool {
		_, ok := m.sessions[id]
		return !ok
	})
	return Result{Code: CodeOK}, m.endSessions(index, ids)
}

// endSessions ends the live sessions ids (sorted, unique) in the entry at
// index, as OpCloseSession and OpExpire do:
//
//  1. Every one of them leaves every queue it waits in, so that no lock is
//     handed to a session that ends in this same entry (invariant 8).
//  2. In ascending ID order, each releases the locks it holds in name order,
//     each granted to its first waiter with token index (EventGranted), and
//     is deleted with its dedupe table (EventSessionEnded).
func (m *Machine) endSessions(index uint64, ids []uint64) []Event {
	// Every queue that holds an ending session is a lock that session lists
	// and does not hold.
	var waited []string
	for _, id := range ids {
		for _, name := range m.sessions[id].names.appendTo(nil) {
			if m.locks.get(name).holder != id {
				waited = append(waited, name)
			}
		}
	}
	// Sorted to drop repeats; the result does not depend on the order.
	slices.Sort(waited)
	waited = slices.Compact(waited)
	for _, name := range waited {
		// One pass per lock, however many of its waiters end.
		m.setQueue(name, slices.DeleteFunc(m.queues[name], func(w uint64) bool {
			_, ending := slices.BinarySearch(ids, w)
			if ending {
				delete(m.waitValues, waitKey{name, w})
			}
			return ending
		}))
	}

	var ev []Event
	for _, id := range ids {
		s := m.sessions[id]
		for _, name := range s.names.sorted() {
			if m.locks.get(name).holder != id {
				continue
			}
			if e, granted := m.handOff(index, name); granted {
				ev = append(ev, e)
			}
		}
		m.removeSession(id)
		ev = append(ev, Event{Kind: EventSessionEnded, Session: id})
	}
	return ev
}

// stampedLimit is the limit a command applies under: the one its leader
// stamped (Command.Limits), or the machine's own (own) for a command
// written without it. A stamp beyond the int range saturates.
func stampedLimit(stamp uint64, own int) int {
	switch {
	case stamp == 0:
		return own
	case stamp > math.MaxInt32:
		return math.MaxInt32
	}
	return int(stamp)
}
