// Package check decides whether a trial's history (package history) is
// correct. Each checker reports violations; any violation fails the trial.
//
//   - linearizability: each lock's operations against a sequential model
//     of one lock (holder, token), with porcupine. Outcomes that are
//     unknown (a context that ended, ErrUnknownOutcome, a session that
//     ended while the request was out) never return: the model lets them
//     take effect at any point after their call, including never. A
//     session's end (close, expiry) frees its lock without a client
//     operation: it is a pseudo-operation whose window runs from the
//     earliest time the cluster may end the session to the latest time
//     it is known to have ended (endBounds). A porcupine timeout is a
//     violation.
//   - mutual-exclusion: at the fenced resource, the Fence never accepted a
//     lower token after a higher one, a token always named one session,
//     and accepted writes of two grants never overlapped while both
//     holders were within their lease.
//   - tokens: tokens of a lock name one grant each, exceed the holder's
//     session ID, and grow in grant order (across leader changes and
//     restarts).
//   - final-state: after healing, the lock table and the session list
//     agree with every acknowledged acquire and release and with the
//     sessions alive for their clients.
//   - lease: the cluster never freed a grant, or reported a session gone,
//     before the client's lease allowed (no early expiry).
//   - availability: after each leader loss, an acquire succeeded again
//     within the history's bound.
//
// The checkers are sound: a violation reported on a history recorded
// from a real system is a real one (each is derived only from real-time
// order, the clients' own monotonic clock readings and the documented
// guarantees). They are not complete: see verify/README.md.
package check
