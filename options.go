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
// session during a leader election.
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
	return o, nil
}
