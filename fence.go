package quorumlock

import (
	"fmt"
	"sync"
)

// Token is a fencing token: the raft log index of the entry whose
// application granted a lock. Tokens of one lock strictly increase with
// every grant, across leader changes and restarts (DESIGN.md invariant 2),
// so a resource that remembers the highest token it accepted can reject a
// holder whose grant has been superseded (Kleppmann, "How to do distributed
// locking", 2016; Chubby's sequencers).
type Token uint64

// Fence is the check a protected resource runs: it admits an operation only
// if its token is at least the highest token admitted before for the same
// resource. A Fence lives with the resource, not with the lock service. It is
// safe for concurrent use; the zero Fence is empty and ready to use. A nil
// *Fence admits nothing (Admit returns ErrInvalidConfig) and has admitted
// nothing (Highest returns 0).
type Fence struct {
	mu      sync.Mutex
	highest map[string]Token
}

// NewFence returns an empty fence.
func NewFence() *Fence { return &Fence{highest: make(map[string]Token)} }

// Admit records t for resource and returns nil if t is at least the highest
// token admitted for resource so far (equal tokens are the same grant doing
// more work). A lower token returns an error wrapping ErrStaleToken and
// changes nothing, and so does token 0, which no grant has (tokens are log
// indexes, from 1; 0 is the Token of a nil Lock, say a failed Acquire's),
// even for a resource that has admitted nothing yet. On a nil *Fence,
// which can record nothing, it returns an error wrapping ErrInvalidConfig
// for every token.
func (f *Fence) Admit(resource string, t Token) error {
	if f == nil {
		return errNoFence
	}
	if t == 0 {
		return fmt.Errorf("%w: token 0 for %q is no grant's", ErrStaleToken, resource)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.highest[resource]; t < h {
		return fmt.Errorf("%w: token %d for %q is below %d", ErrStaleToken, t, resource, h)
	}
	if f.highest == nil {
		f.highest = make(map[string]Token) // a zero Fence is ready to use
	}
	f.highest[resource] = t
	return nil
}

// Highest returns the highest token admitted for resource (0 if none, and
// on a nil *Fence).
func (f *Fence) Highest(resource string) Token {
	if f == nil {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.highest[resource]
}
