package quorumlock

import (
	"fmt"
	"time"
)

// SessionOption is a per-session knob for NewSession. A nil SessionOption
// is ignored.
type SessionOption func(*sessionOptions)

type sessionOptions struct {
	ttl time.Duration
}

// WithTTL sets the session's TTL, in [MinSessionTTL, MaxSessionTTL]
// (NewSession returns ErrInvalidTTL otherwise). The default is
// Config.SessionTTL (with a Client, Dial's WithSessionTTL). Unlike
// Config.SessionTTL, it is not checked against the cluster's election
// timeout: a TTL of twice the election timeout or less can expire the
// session during a leader election. The cluster keeps TTLs in whole
// milliseconds, so d is truncated to a millisecond (Session.TTL reports
// the truncated value, the one the cluster lists and expires by).
func WithTTL(d time.Duration) SessionOption {
	return func(o *sessionOptions) { o.ttl = d }
}

// newSessionOptions applies opts (nil ones skipped) over the default TTL
// ttl and checks the result: ErrInvalidTTL for a TTL outside
// [MinSessionTTL, MaxSessionTTL].
func newSessionOptions(ttl time.Duration, opts []SessionOption) (sessionOptions, error) {
	o := sessionOptions{ttl: ttl}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.ttl < MinSessionTTL || o.ttl > MaxSessionTTL {
		return o, fmt.Errorf("%w: %v is outside [%v, %v]", ErrInvalidTTL, o.ttl, MinSessionTTL, MaxSessionTTL)
	}
	// The cluster keeps TTLs in milliseconds (the open-session command's
	// TtlMs); the client's lease must count the same TTL.
	o.ttl = o.ttl.Truncate(time.Millisecond)
	return o, nil
}
