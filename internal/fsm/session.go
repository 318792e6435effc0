package fsm

import "slices"

// session is one live session.
type session struct {
	ttl int64 // nanoseconds
	// done is the highest Done the session's commands carried (clamped to
	// their Seq): outcomes of sequence numbers below it are forgotten, and
	// commands with such a Seq are retired.
	done uint64
	// outcomes remembers the outcome of every applied command with
	// Seq >= done, sorted by seq. Clients advance Done with each request, so
	// it usually holds one or two entries; a slice is smaller than a map.
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

// forget drops the outcomes of sequence numbers below done and raises s.done
// to done if it is higher.
func (s *session) forget(done uint64) {
	if done <= s.done {
		return
	}
	s.done = done
	if n, _ := s.find(done); n > 0 {
		rest := copy(s.outcomes, s.outcomes[n:])
		clear(s.outcomes[rest:]) // drop references to names
		s.outcomes = s.outcomes[:rest]
	}
}

// forgettable returns how many outcomes forget(done) would drop.
func (s *session) forgettable(done uint64) int {
	if done <= s.done {
		return 0
	}
	n, _ := s.find(done)
	return n
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
