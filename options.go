package quorumlock

import "time"

// SessionOption is a per-session knob for NewSession. A nil SessionOption
// is ignored.
type SessionOption func(*sessionOptions)

type sessionOptions struct {
	ttl time.Duration
}

// WithTTL sets the session's TTL, in [MinSessionTTL, MaxSessionTTL]
// (NewSession returns ErrInvalidTTL otherwise). The default is
// Config.SessionTTL.
func WithTTL(d time.Duration) SessionOption {
	return func(o *sessionOptions) { o.ttl = d }
}
