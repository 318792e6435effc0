// Package fsm is the lock table state machine that every replica applies
// committed raft entries to. It is a pure function of (state, index, term,
// command): no clocks, no randomness, no I/O, and no dependence on map
// iteration order, so every replica that applies the same log reaches the
// same state and emits the same results (DESIGN.md invariant 11). Time
// decisions (which sessions expire) are made by the leader and arrive here as
// logged commands.
//
// A Machine is not safe for concurrent use: the apply goroutine owns it, and
// readers must be serialised with apply by the caller.
package fsm

// Op is the kind of a command.
type Op uint8

// The commands of the lock table log.
const (
	// OpOpenSession creates a session whose ID is the index of the entry,
	// or, when OpenID names a live session, returns that one (see
	// Command.OpenID). Fields: TTL, Nonce, OpenID.
	OpOpenSession Op = 1
	// OpAcquire grants Name to Session if it is free, queues Session behind
	// the holder (FIFO) otherwise, or fails with CodeLocked when Try is set.
	// Fields: Session, Seq, Done, Name, Try.
	OpAcquire Op = 2
	// OpRelease frees Name if Session holds it under Token, then grants it to
	// the first waiter. Fields: Session, Seq, Done, Name, Token.
	OpRelease Op = 3
	// OpWithdraw removes Session from the queue of Name (an acquire whose
	// caller gave up). If the lock was already granted to Session, nothing
	// changes and the result is the grant. With Target set, an acquire of
	// Session with Seq Target that is not applied yet will take no effect
	// (see Command.Target). Fields: Session, Seq, Done, Name, Target.
	OpWithdraw Op = 4
	// OpCloseSession releases every lock of Session, drops its waits and ends
	// it. Fields: Session, Seq, Done.
	OpCloseSession Op = 5
	// OpProclaim replaces the value of Name if Session holds it under Token
	// (CodeOK), and fails with CodeNotHeld otherwise. Fields: Session, Seq,
	// Done, Name, Token, Value.
	OpProclaim Op = 7
	// OpRevoke ends every live session in IDs as OpExpire does, whatever the
	// term: an operator's decision, logged like any other. Fields: IDs,
	// Nonce.
	OpRevoke Op = 8
	// OpExpire ends every live session in IDs as OpCloseSession does. It is
	// ignored (CodeStaleTerm) unless Term equals the term of the entry that
	// carries it: only the leader whose clock saw the TTL pass may expire.
	// Fields: IDs, Term.
	OpExpire Op = 6
)

// Command is one logged change. Which fields matter depends on Op.
type Command struct {
	Op Op
	// Session is the session the command acts for.
	Session uint64
	// Seq numbers the session's requests, from 1. A command whose
	// (Session, Seq) was applied before takes no effect again and returns the
	// original outcome (for an acquire that was queued: its current outcome).
	Seq uint64
	// Done tells that the client has every response for sequence numbers
	// below it: the machine forgets those outcomes, and a command with
	// Seq < Done of an earlier command fails with CodeInvalid.
	Done uint64
	// Listed tells that Pending lists every other request of the session
	// in flight with a lower Seq (sorted, each in [Done, Seq)): then every
	// other Seq below this one is finished too, and is retired as if below
	// Done. A long request in flight (a waiting acquire) thus does not
	// keep the outcomes of every later request of its session.
	Listed  bool
	Pending []uint64
	// Name is the lock name.
	Name string
	// Try makes an acquire fail with CodeLocked instead of queueing.
	Try bool
	// Token is the grant a release names (fenced release, invariant 7).
	Token uint64
	// TTL is the session TTL in nanoseconds (OpOpenSession).
	TTL int64
	// Nonce lets the proposer of an OpOpenSession or OpRevoke find its
	// result.
	Nonce uint64
	// OpenID is chosen by the client for one NewSession call and carried
	// by each of its attempts (OpOpenSession). While the session an open
	// with a non-zero OpenID created lives, another open with the same
	// OpenID creates nothing and returns that session: a retry whose first
	// attempt's answer was lost gets the session the first attempt opened
	// instead of a second one. 0: no deduplication (commands written
	// before open IDs existed).
	OpenID uint64
	// IDs are the sessions to expire (OpExpire), in any order.
	IDs []uint64
	// Term is the term of the leader that decided the expiry (OpExpire).
	Term uint64
	// Value is the value an acquire attaches to its grant (kept while the
	// session holds the lock; a waiter's value travels with it), or the new
	// value of an OpProclaim. Leader election stores the leader's value
	// here. At most MaxValueBytes.
	Value []byte
	// Target is the Seq of the acquire an OpWithdraw takes back. If that
	// acquire has not been applied yet, its outcome is recorded as
	// CodeWithdrawn so that it takes no effect when it arrives later. An
	// OpWithdraw with an empty Name takes back Target only: the session
	// keeps its place in every queue (another call of the session waits
	// there).
	Target uint64
	// Limits are the proposing leader's configured limits, stamped on the
	// command so that every replica applies it under the same ones: limits
	// configured per replica (a rolling change, one host's typo) would
	// otherwise make the same log give different lock tables (invariant
	// 11), and two holders of a lock once another replica leads. Only the
	// fields an Op checks are encoded: MaxSessions for OpOpenSession;
	// MaxNameBytes, MaxLocksPerSession and MaxWaitersPerLock for OpAcquire.
	// A zero field (a command written before limits were stamped) means
	// the machine's own limit.
	Limits Stamped
}

// Stamped are the limits a leader stamps on a command (Command.Limits).
type Stamped struct {
	MaxNameBytes, MaxSessions, MaxLocksPerSession, MaxWaitersPerLock uint64
}

// Code is the outcome class of a command.
type Code uint8

// Outcomes.
const (
	CodeOK        Code = 0 // applied; for an acquire: granted, Result.Token set
	CodeQueued    Code = 1 // acquire: waiting in FIFO order behind the holder
	CodeLocked    Code = 2 // try-acquire: another session holds the lock
	CodeNotHeld   Code = 3 // release: Token is not the session's current grant
	CodeNoSession Code = 4 // the session does not exist (expired or closed)
	CodeLimit     Code = 5 // a Limits bound was reached; nothing changed
	CodeInvalid   Code = 6 // malformed command (bad name, TTL, retired Seq)
	CodeWithdrawn Code = 7 // withdraw: removed from the queue; acquire dup: no longer waiting
	CodeStaleTerm Code = 8 // expire: decided in another term; ignored
)

// Result is the outcome of one command.
type Result struct {
	Code Code
	// Token is the fencing token of the grant (acquire, or withdraw that
	// found the lock already granted) or of the released grant (release).
	Token uint64
	// Session is the new session's ID (OpOpenSession); for an open whose
	// OpenID named a live session, that session's ID, which is then not
	// the entry's index.
	Session uint64
}

// EventKind says what an Event reports.
type EventKind uint8

const (
	// EventGranted: Name was granted to Session with Token while applying a
	// command other than that session's own acquire (a release, withdraw,
	// close or expiry handed the lock to the next waiter).
	EventGranted EventKind = 1
	// EventSessionEnded: Session was closed or expired; all of its locks and
	// waits are gone.
	EventSessionEnded EventKind = 2
)

// Event is a side effect of applying a command that a waiting caller may care
// about. Events of one command are in a deterministic order.
type Event struct {
	Kind    EventKind
	Session uint64
	Name    string
	Token   uint64
}

// Limits bound the table. Zero fields take the defaults below.
type Limits struct {
	// MaxNameBytes bounds lock names (1..MaxNameBytes bytes of valid UTF-8
	// without NUL). The default is 256.
	MaxNameBytes int
	// MaxSessions bounds live sessions. The default is 1,000,000.
	MaxSessions int
	// MaxLocksPerSession bounds the locks one session holds or waits for.
	// The default is 10,000.
	MaxLocksPerSession int
	// MaxWaitersPerLock bounds the queue of one lock. The default is 10,000.
	MaxWaitersPerLock int
	// MaxPendingPerSession bounds remembered outcomes (sequence numbers at or
	// above Done) per session. The default is 1,024.
	MaxPendingPerSession int
	// MaxValueBytes bounds Command.Value. The default is 4,096.
	MaxValueBytes int
	// MinTTL and MaxTTL bound session TTLs in nanoseconds. The defaults are
	// 1 s and 10 min.
	MinTTL, MaxTTL int64
}

// LockInfo describes one lock.
type LockInfo struct {
	Name    string
	Holder  uint64   // 0 when free
	Token   uint64   // token of the current grant; 0 when free
	Waiters []uint64 // sessions waiting, in grant order
	Value   []byte   // the holder's value (Command.Value); nil if none
}

// SessionInfo describes one live session.
type SessionInfo struct {
	ID  uint64
	TTL int64 // nanoseconds
}
