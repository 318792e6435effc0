package fsm

import "slices"

// session is one live session.
type session struct {
	ttl int64 // nanoseconds
	// openID is the Command.OpenID of the open that created the session
	// (0: none). It fills the struct's size class (112 bytes with or
	// without it), where a map from session to open ID would not.
	openID uint64
	// done is the highest Done the session's commands carried (clamped to
	// their Seq): outcomes of sequence numbers below it are forgotten, and
	// commands with such a Seq are retired.
	done uint64
	// hi and holes extend done for commands that list the session's
	// requests in flight (Command.Listed): below hi, every seq but the
	// holes is retired too. holes is sorted and lies within [done, hi).
	// Without them, one request in flight for long (a waiting acquire)
	// would hold done back, and the outcomes of every later request would
	// pile up to MaxPendingPerSession.
	hi    uint64
	holes []uint64
	// outcomes remembers the outcome of every applied command with a seq
	// that is not retired, sorted by seq. Clients advance Done with each
	// request, so it usually holds one or two entries; a slice is smaller
	// than a map.
	outcomes []outcome
	// names are the locks the session holds or waits for.
	names nameSet
}

// outcome is the remembered result of one (session, seq).
type outcome struct {
	seq   uint64
	token uint64
	// name is the lock of a queued acquire, whose duplicate reports the
	// acquire's current outcome; empty otherwise.
	name string
	code Code
}

// find returns the position of seq in s.outcomes and whether it is there.
func (s *session) find(seq uint64) (int, bool) {
	return slices.BinarySearchFunc(s.outcomes, seq, func(o outcome, seq uint64) int {
		switch {
		case o.seq < seq:
			return -1
		case o.seq > seq:
			return 1
		}
		return 0
	})
}

// retired reports whether seq is finished for the client: its outcome is
// forgotten and a command with it takes no effect (CodeInvalid).
func (s *session) retired(seq uint64) bool {
	r := retirement{done: s.done, hi: s.hi, holes: s.holes}
	return r.retires(seq)
}

// retirement is what applying a command does to a session's retired
// sequence numbers (see plan).
type retirement struct {
	done, hi uint64
	holes    []uint64
	kept     int // outcomes that stay
}

// retires reports whether seq is retired under r.
func (r *retirement) retires(seq uint64) bool {
	if seq < r.done {
		return true
	}
	if seq >= r.hi {
		return false
	}
	_, hole := slices.BinarySearch(r.holes, seq)
	return !hole
}

// plan computes the retirement a command with seq, done (at most seq) and,
// when listed, the session's other requests in flight (pending, sorted,
// each below seq) makes: every seq below done is retired and, for a listed
// command, every seq in [done, seq) that is not pending (the client has
// its answer, or gave up on it, and never sends it again). It changes
// nothing.
func (s *session) plan(seq, done uint64, listed bool, pending []uint64) retirement {
	d := max(s.done, done)
	r := retirement{done: d, hi: max(s.hi, d)}
	if listed {
		r.hi = max(r.hi, seq)
		inPending := func(x uint64) bool { _, ok := slices.BinarySearch(pending, x); return ok }
		for _, h := range s.holes {
			if h >= d && (h >= seq || inPending(h)) {
				r.holes = append(r.holes, h)
			}
		}
		for _, p := range pending {
			if p >= max(s.hi, d) && p < seq {
				r.holes = append(r.holes, p)
			}
		}
		slices.Sort(r.holes)
		r.holes = slices.Compact(r.holes)
		// Everything below the lowest hole (or hi) is retired.
		r.done = r.hi
		if len(r.holes) > 0 {
			r.done = r.holes[0]
		}
	} else {
		for _, h := range s.holes {
			if h >= d {
				r.holes = append(r.holes, h)
			}
		}
	}
	for _, o := range s.outcomes {
		if !r.retires(o.seq) {
			r.kept++
		}
	}
	return r
}

// entries counts what s keeps after r, once per sequence number: each kept
// outcome, each hole without one, and each of seqs (the command's own, a
// target it records), which have no outcome yet (MaxPendingPerSession
// bounds it).
func (s *session) entries(r *retirement, seqs ...uint64) int {
	n := r.kept
	for _, h := range r.holes {
		if _, ok := s.find(h); !ok {
			n++
		}
	}
	for _, q := range seqs {
		if _, hole := slices.BinarySearch(r.holes, q); !hole {
			n++
		}
	}
	return n
}

// retire applies r (from plan): the outcomes of retired seqs are dropped.
func (s *session) retire(r retirement) {
	s.done, s.hi, s.holes = r.done, r.hi, r.holes
	kept := s.outcomes[:0]
	for _, o := range s.outcomes {
		if !r.retires(o.seq) {
			kept = append(kept, o)
		}
	}
	clear(s.outcomes[len(kept):]) // drop references to names
	s.outcomes = kept
}

// remember records o, whose seq is not in s.outcomes. Seqs mostly arrive in
// order, so this is mostly an append.
func (s *session) remember(o outcome) {
	if n := len(s.outcomes); n == 0 || s.outcomes[n-1].seq < o.seq {
		s.outcomes = append(s.outcomes, o)
		return
	}
	i, _ := s.find(o.seq)
	s.outcomes = slices.Insert(s.outcomes, i, o)
}

// smallSet is the size up to which a nameSet is a slice; beyond it a map
// keeps membership tests and removals O(1).
const smallSet = 16

// nameSet is a set of lock names. Most sessions hold a few locks, so it is a
// short unsorted slice until it outgrows smallSet, then a map.
type nameSet struct {
	list []string
	set  map[string]struct{}
}

func (n *nameSet) len() int {
	if n.set != nil {
		return len(n.set)
	}
	return len(n.list)
}

func (n *nameSet) has(name string) bool {
	if n.set != nil {
		_, ok := n.set[name]
		return ok
	}
	return slices.Contains(n.list, name)
}

// add inserts name, which must not be in the set.
func (n *nameSet) add(name string) {
	if n.set != nil {
		n.set[name] = struct{}{}
		return
	}
	if len(n.list) < smallSet {
		if len(n.list) == cap(n.list) {
			// Grow by half, not append's doubling: a held lock's share of
			// its session's list is a good part of its memory.
			grown := make([]string, len(n.list), len(n.list)+len(n.list)/2+1)
			copy(grown, n.list)
			n.list = grown
		}
		n.list = append(n.list, name)
		return
	}
	n.set = make(map[string]struct{}, 2*smallSet)
	for _, x := range n.list {
		n.set[x] = struct{}{}
	}
	n.set[name] = struct{}{}
	n.list = nil
}

func (n *nameSet) remove(name string) {
	if n.set != nil {
		delete(n.set, name)
		return
	}
	if i := slices.Index(n.list, name); i >= 0 {
		last := len(n.list) - 1
		n.list[i] = n.list[last]
		n.list[last] = ""
		n.list = n.list[:last] // keeps its capacity for the next acquire
	}
}

// appendTo appends the names to dst in no particular order.
func (n *nameSet) appendTo(dst []string) []string {
	if n.set != nil {
		for name := range n.set {
			dst = append(dst, name)
		}
		return dst
	}
	return append(dst, n.list...)
}

// sorted returns the names in a fresh sorted slice.
func (n *nameSet) sorted() []string {
	out := n.appendTo(make([]string, 0, n.len()))
	slices.Sort(out)
	return out
}
