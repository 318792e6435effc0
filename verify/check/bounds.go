package check

import (
	"math"

	"github.com/quorumlock/quorumlock/verify/history"
)

// never stands for an open upper bound.
const never int64 = math.MaxInt64

// endBounds returns the window in which the cluster may have ended session
// s: from the earliest time it may legally end it to the latest time it is
// known to have ended. ok is false for a session alive at the end of the
// trial (no end to model).
//
// Earliest: the first Close the client sent; the call of an operation
// during which the session ended with an unknown outcome (quorumlock
// closes a session it abandons in the background); otherwise
// the end of the client's belief, Deadline (the send time of the last
// acknowledged heartbeat + TTL - margin): a client whose lease ran out
// sends a close from then on. Where no close was sent at all (its process
// stopped, or the cluster reported it gone), expiry is the only way and it
// may not happen before Deadline + margin, a full TTL after that
// heartbeat's send time.
//
// Latest: the return of a successful Close; the moment the client was told
// the session is gone; the final check that saw it absent; else open.
func endBounds(s *history.Session) (lo, hi int64, ok bool) {
	if s.Ended == 0 && s.CloseCall == 0 && s.ListedAtEnd {
		return 0, 0, false
	}
	lo = never
	if s.CloseCall > 0 {
		lo = s.CloseCall
	}
	if s.Abandon > 0 {
		lo = min(lo, s.Abandon)
	}
	expiry := s.Deadline
	if s.Ended > 0 && history.NoCloseSent(s.Cause) {
		expiry += s.Margin
	}
	lo = min(lo, expiry)
	hi = never
	switch {
	case s.CloseOK && s.CloseReturn > 0:
		hi = s.CloseReturn
	case s.Cause == history.EndCluster && s.Ended > 0:
		hi = s.Ended
	case s.Gone > 0:
		hi = s.Gone
	}
	return lo, hi, true
}

// beliefEnd returns the time until which the cluster must keep session s's
// grant of token on lock: the first release of it the client sent, or the
// earliest end of the session.
func (x *index) beliefEnd(lock string, session, token uint64) int64 {
	end := never
	if s := x.sessions[session]; s != nil {
		if lo, _, ok := endBounds(s); ok {
			end = lo
		}
	}
	if t, ok := x.released[grant{lock, session, token}]; ok {
		end = min(end, t)
	}
	return end
}
