package check

import (
	"slices"

	"github.com/quorumlock/quorumlock/verify/history"
)

// grant identifies one grant of a lock.
type grant struct {
	lock    string
	session uint64
	token   uint64
}

// index is a history arranged for the checkers.
type index struct {
	h        *history.History
	sessions map[uint64]*history.Session
	byLock   map[string][]history.Op // each lock's operations, by call time
	released map[grant]int64         // first release call of each grant
}

func newIndex(h *history.History) *index {
	x := &index{
		h:        h,
		sessions: make(map[uint64]*history.Session),
		byLock:   make(map[string][]history.Op),
		released: make(map[grant]int64),
	}
	for _, s := range h.Sessions {
		x.sessions[s.ID] = s
	}
	for _, op := range h.Ops {
		x.byLock[op.Lock] = append(x.byLock[op.Lock], op)
		if op.Kind == history.Release {
			g := grant{op.Lock, op.Session, op.Token}
			if t, ok := x.released[g]; !ok || op.Call < t {
				x.released[g] = op.Call
			}
		}
	}
	for _, ops := range x.byLock {
		slices.SortStableFunc(ops, func(a, b history.Op) int { return cmp64(a.Call, b.Call) })
	}
	return x
}

// locks returns the lock names of the history in a fixed order.
func (x *index) locks() []string {
	names := slices.Clone(x.h.Locks)
	for name := range x.byLock {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func cmp64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ret returns an operation's return time, never for an open one.
func ret(op history.Op) int64 {
	if op.Return == history.Open {
		return never
	}
	return op.Return
}
