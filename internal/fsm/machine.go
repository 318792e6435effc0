package fsm

import (
	"cmp"
	"slices"
)

// Default limits, applied by New to zero (or negative) Limits fields.
const (
	defaultMaxNameBytes         = 256
	defaultMaxSessions          = 1_000_000
	defaultMaxLocksPerSession   = 10_000
	defaultMaxWaitersPerLock    = 10_000
	defaultMaxPendingPerSession = 1_024
	defaultMaxValueBytes        = 4_096
	defaultMinTTL               = int64(1_000_000_000)   // 1 s in nanoseconds
	defaultMaxTTL               = int64(600_000_000_000) // 10 min in nanoseconds
)

// Machine is the lock table of one replica: live sessions, held locks with
// their FIFO wait queues, and each session's table of remembered outcomes.
//
// The apply goroutine owns a Machine: Apply, ApplyEntry and SetApplied mutate
// it, and the read methods (Holder, Session, Sessions, SessionLocks,
// NumSessions, NumLocks, Applied, Limits) must not run concurrently with them.
// Read methods never mutate, so several readers may run together while no
// apply runs. Every returned slice is a fresh copy the caller may keep.
type Machine struct {
	lim     Limits
	applied uint64

	sessions map[uint64]*session
	// order lists the live sessions by ID: IDs are the indexes of their
	// opening entries, so a new session goes at the end, and an ended one
	// is only marked (nil) until half the slots are dead. Snapshots and the
	// sorted listings walk it instead of sorting the map's keys.
	order []sessionRef
	dead  int // ended sessions still in order
	// locks holds only held locks: a lock without a holder has no entry (a
	// lock with waiters always has a holder, because a free lock is granted
	// at once).
	locks *lockTable
	// queues holds the waiters of each held lock that has any, in grant
	// order; never an empty slice. Kept apart from locks so that the common
	// uncontended lock costs one small map slot.
	queues map[string][]uint64
	// values holds the value of each held lock that has one, and
	// waitValues the value each waiter will bring to its grant. Locks
	// without values (the common case) cost nothing here.
	values     map[string][]byte
	waitValues map[waitKey][]byte
	// opens maps the Command.OpenID of each live session opened with a
	// non-zero one to the session's ID, for the deduplication of opens.
	opens map[uint64]uint64
}

type sessionRef struct {
	id uint64
	s  *session // nil once the session ended
}

// addSession records a new session, whose ID is above every live one and
// whose open ID (if any) names no live session.
func (m *Machine) addSession(id uint64, s *session) {
	m.sessions[id] = s
	m.order = append(m.order, sessionRef{id, s})
	if s.openID != 0 {
		m.opens[s.openID] = id
	}
}

// removeSession forgets the live session id.
func (m *Machine) removeSession(id uint64) {
	if s := m.sessions[id]; s != nil && s.openID != 0 {
		delete(m.opens, s.openID)
	}
	delete(m.sessions, id)
	i, ok := slices.BinarySearchFunc(m.order, id, func(r sessionRef, id uint64) int { return cmp.Compare(r.id, id) })
	if !ok || m.order[i].s == nil {
		return
	}
	m.order[i].s = nil
	m.dead++
	if m.dead > len(m.order)/2 {
		m.order = slices.DeleteFunc(m.order, func(r sessionRef) bool { return r.s == nil })
		m.dead = 0
	}
}

// liveAfter calls f for every live session with an ID above after, in ID
// order, until f returns false.
func (m *Machine) liveAfter(after uint64, f func(id uint64, s *session) bool) {
	i, found := slices.BinarySearchFunc(m.order, after, func(r sessionRef, id uint64) int { return cmp.Compare(r.id, id) })
	if found {
		i++ // not after+1: the largest ID has nothing after it
	}
	for _, r := range m.order[i:] {
		if r.s != nil && !f(r.id, r.s) {
			return
		}
	}
}

type waitKey struct {
	name    string
	session uint64
}

// lock is one held lock.
type lock struct {
	holder uint64 // session ID
	token  uint64 // index of the entry that granted it
}

// New returns an empty Machine with Applied() == 0. Zero fields of l take the
// defaults documented on Limits; negative ones are treated as zero. New does
// not check that MinTTL <= MaxTTL: with an empty TTL range every OpOpenSession
// fails with CodeInvalid, so the caller validates its configuration first.
func New(l Limits) *Machine {
	return &Machine{
		lim:        withDefaults(l),
		sessions:   make(map[uint64]*session),
		locks:      newLockTable(),
		queues:     make(map[string][]uint64),
		values:     make(map[string][]byte),
		waitValues: make(map[waitKey][]byte),
		opens:      make(map[uint64]uint64),
	}
}

func withDefaults(l Limits) Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxNameBytes, defaultMaxNameBytes)
	def(&l.MaxSessions, defaultMaxSessions)
	def(&l.MaxLocksPerSession, defaultMaxLocksPerSession)
	def(&l.MaxWaitersPerLock, defaultMaxWaitersPerLock)
	def(&l.MaxPendingPerSession, defaultMaxPendingPerSession)
	def(&l.MaxValueBytes, defaultMaxValueBytes)
	if l.MinTTL <= 0 {
		l.MinTTL = defaultMinTTL
	}
	if l.MaxTTL <= 0 {
		l.MaxTTL = defaultMaxTTL
	}
	return l
}

// Limits returns the effective limits: those given to New with defaults
// applied.
func (m *Machine) Limits() Limits { return m.lim }

// Applied returns the index of the last entry applied (through Apply,
// ApplyEntry or SetApplied), or 0 before any.
func (m *Machine) Applied() uint64 { return m.applied }

// SetApplied records that the entry at index was applied without being a
// command (a raft no-op or configuration change), so Applied() == index
// afterwards. An index at or below Applied() is ignored: the applied index
// never moves backwards.
func (m *Machine) SetApplied(index uint64) {
	if index > m.applied {
		m.applied = index
	}
}

// NumSessions returns the number of live sessions.
func (m *Machine) NumSessions() int { return len(m.sessions) }

// NumLocks returns the number of held locks (a free lock is not stored).
func (m *Machine) NumLocks() int { return m.locks.len() }

// Holder describes the lock called name. For a free or never used name it
// returns LockInfo{Name: name}: Holder 0, Token 0, no waiters. Waiters is a
// fresh slice (nil when no session waits) in grant order.
func (m *Machine) Holder(name string) LockInfo {
	l, ok := m.locks.lookup(name)
	if !ok {
		return LockInfo{Name: name}
	}
	return m.info(name, l)
}

// HolderID returns the session holding the lock called name, 0 when it is
// free. Unlike Holder it does not allocate.
func (m *Machine) HolderID(name string) uint64 {
	l, ok := m.locks.lookup(name)
	if !ok {
		return 0
	}
	return l.holder
}

func (m *Machine) info(name string, l lock) LockInfo {
	return LockInfo{Name: name, Holder: l.holder, Token: l.token, Waiters: slices.Clone(m.queues[name]), Value: slices.Clone(m.values[name])}
}

// Locks returns up to limit held locks (roles included, their keys starting
// with RolePrefix) whose keys sort after the key after, in key order, and
// whether more follow. It sorts every key: for operators, not hot paths.
func (m *Machine) Locks(after string, limit int) (out []LockInfo, more bool) {
	keys := make([]string, 0, m.locks.len())
	for k := range m.locks.all() {
		if k > after {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	if len(keys) > limit {
		keys, more = keys[:limit], true
	}
	for _, k := range keys {
		out = append(out, m.info(k, m.locks.get(k)))
	}
	return out, more
}

// SessionsAfter returns up to limit live sessions with IDs above after, in
// ID order, and whether more follow.
func (m *Machine) SessionsAfter(after uint64, limit int) (out []SessionInfo, more bool) {
	m.liveAfter(after, func(id uint64, s *session) bool {
		if len(out) == limit {
			more = true
			return false
		}
		out = append(out, SessionInfo{ID: id, TTL: s.ttl})
		return true
	})
	return out, more
}

// Held returns how many locks (and roles) session id holds.
func (m *Machine) Held(id uint64) int {
	s, ok := m.sessions[id]
	if !ok {
		return 0
	}
	n := 0
	for _, name := range s.names.appendTo(nil) {
		if m.locks.get(name).holder == id {
			n++
		}
	}
	return n
}

// Session returns the live session id, or false if it does not exist (never
// opened, closed or expired).
func (m *Machine) Session(id uint64) (SessionInfo, bool) {
	s, ok := m.sessions[id]
	if !ok {
		return SessionInfo{}, false
	}
	return SessionInfo{ID: id, TTL: s.ttl}, true
}

// OpenedBy returns the live session that an open with the non-zero
// openID created (Command.OpenID), or false if there is none.
func (m *Machine) OpenedBy(openID uint64) (SessionInfo, bool) {
	if openID == 0 {
		return SessionInfo{}, false
	}
	id, ok := m.opens[openID]
	if !ok {
		return SessionInfo{}, false
	}
	return SessionInfo{ID: id, TTL: m.sessions[id].ttl}, true
}

// Sessions returns every live session, sorted by ID, in a fresh slice (nil
// when there is none).
func (m *Machine) Sessions() []SessionInfo {
	if len(m.sessions) == 0 {
		return nil
	}
	out := make([]SessionInfo, 0, len(m.sessions))
	m.liveAfter(0, func(id uint64, s *session) bool {
		out = append(out, SessionInfo{ID: id, TTL: s.ttl})
		return true
	})
	return out
}

// SessionLocks returns the locks that session id holds (not those it waits
// for), sorted by name, in a fresh slice. It returns nil for a session that
// holds nothing or does not exist.
func (m *Machine) SessionLocks(id uint64) []LockInfo {
	s, ok := m.sessions[id]
	if !ok {
		return nil
	}
	var out []LockInfo
	for _, name := range s.names.sorted() {
		if l := m.locks.get(name); l.holder == id {
			out = append(out, m.info(name, l))
		}
	}
	return out
}
