package quorumlock

import "errors"

// Sentinel errors. Every error quorumlock returns for one of these conditions
// wraps the sentinel, so test with errors.Is.
var (
	// ErrLocked is returned by TryAcquire when another session holds the
	// lock.
	ErrLocked = errors.New("quorumlock: lock held by another session")

	// ErrSessionExpired is returned by calls on a session that is over:
	// expired on the cluster, past its client-side lease (the send time of
	// its last acknowledged heartbeat plus TTL minus the safety margin),
	// closed, or abandoned; and by Client.RevokeSession for a session that
	// is not live. An expired session is never renewed.
	ErrSessionExpired = errors.New("quorumlock: session expired")

	// ErrStaleToken is returned by Fence.Admit for a token lower than the
	// highest one already admitted for the resource, and for token 0 (no
	// grant's).
	ErrStaleToken = errors.New("quorumlock: stale fencing token")

	// ErrInvalidName is returned for a lock name or role that is empty,
	// longer than Config.MaxNameBytes, not valid UTF-8, or contains NUL
	// (and by Client.Locks for a cursor that is not valid UTF-8).
	ErrInvalidName = errors.New("quorumlock: invalid lock name")

	// ErrNotHeld is returned by Lock.Release when the lock's grant is no
	// longer current (already released, or the session lost it), by
	// Leadership.Resign and Proclaim when the leadership is over, and by
	// Acquire (Session.Elect) when a concurrent Release (Resign) of the
	// session freed the grant.
	ErrNotHeld = errors.New("quorumlock: lock not held")

	// ErrLimit is returned when a limit would be exceeded: a configured
	// one (sessions, locks per session, waiters per lock), the 1,024
	// outcomes the cluster keeps per session for its requests in flight,
	// or MaxValueBytes for a leadership's value. Nothing changed (when
	// Lock.Release or Leadership.Proclaim is refused for the requests
	// pending, it comes wrapped with ErrUnknownOutcome: see there).
	ErrLimit = errors.New("quorumlock: limit reached")

	// ErrClosed is returned by calls on a Node or a Client (or the
	// sessions opened through it) after Close, or after the replica
	// stopped on a failure (a storage error, or a peer's message raft
	// cannot accept: Node.Err says which), and by calls on a nil or zero
	// Node or Client (the nil of a failed Start or Dial).
	ErrClosed = errors.New("quorumlock: closed")

	// ErrUnknownOutcome is returned when a request may or may not have taken
	// effect: the caller's context ended after the request was sent and
	// before an answer came, or (wrapping ErrLimit) a Release or Proclaim
	// was refused while another copy of it may still apply. (Acquire never returns
	// it: it settles the outcome first, see Session.Acquire and
	// ErrWithdrawPending.)
	ErrUnknownOutcome = errors.New("quorumlock: outcome unknown")

	// ErrWithdrawPending comes joined with the context's error from
	// Acquire, TryAcquire and Session.Elect (and Node.Elect and
	// Client.Elect) when ctx ended before the call was answered and the
	// cluster could not confirm the request's withdrawal in time (no
	// leader: an election, a partition, no quorum; or a machine so loaded
	// that the round trip to the leader takes longer than the time left).
	// The call did not get
	// the lock (or role); a Lock of it that the session already held stays
	// held. The session stays alive and keeps its other locks; it goes on
	// withdrawing in the background and releases a grant that won the race.
	// (Node.Elect and Client.Elect close their dedicated session instead,
	// in the background while no leader answers.) Until that is confirmed,
	// Holder (Leader) may show the session queued, or holding a grant that
	// won the race until it is released: the lock is kept from other
	// sessions meanwhile, and mutual exclusion holds throughout. A later
	// waiting Acquire of the same name by the session waits for the
	// withdrawal first; if its ctx ends meanwhile, it returns ctx's error
	// alone, having sent nothing. (etcd's Mutex.Lock and Curator's acquire
	// clean up after a cancelled wait too.)
	ErrWithdrawPending = errors.New("quorumlock: withdrawal pending")

	// ErrInvalidConfig is returned by Start for a bad Config field and by
	// Dial for bad addresses or options; the message names the field or
	// option. Fence.Admit returns it on a nil *Fence.
	ErrInvalidConfig = errors.New("quorumlock: invalid config")

	// ErrInvalidTTL is returned by NewSession for a TTL outside
	// [MinSessionTTL, MaxSessionTTL].
	ErrInvalidTTL = errors.New("quorumlock: invalid session TTL")

	// ErrNoLeader is returned by Node.Leader and Client.Leader when no
	// session leads the role.
	ErrNoLeader = errors.New("quorumlock: no leader")

	// ErrForeignDataDir is returned by Start when the data directory was
	// written by another cluster or another member ID.
	ErrForeignDataDir = errors.New("quorumlock: data directory belongs to another cluster or member")
)
