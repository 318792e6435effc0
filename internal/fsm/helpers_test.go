package fsm

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// dump renders the whole state of m, dedupe tables included, in a canonical
// form: two machines are in the same state exactly when their dumps are equal.
func dump(m *Machine) string {
	var b strings.Builder
	fmt.Fprintf(&b, "applied=%d\n", m.applied)
	ids := make([]uint64, 0, len(m.sessions))
	for id := range m.sessions {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		s := m.sessions[id]
		fmt.Fprintf(&b, "session %d ttl=%d done=%d ", id, s.ttl, s.done)
		if s.openID != 0 {
			fmt.Fprintf(&b, "open-id=%d ", s.openID)
		}
		if s.hi != s.done || len(s.holes) > 0 {
			fmt.Fprintf(&b, "hi=%d holes=%v ", s.hi, s.holes)
		}
		fmt.Fprintf(&b, "names=%v outcomes=[", s.names.sorted())
		for i, o := range s.outcomes {
			if i > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "%d:%s", o.seq, o.code)
			if o.token != 0 {
				fmt.Fprintf(&b, "/%d", o.token)
			}
			if o.name != "" {
				fmt.Fprintf(&b, "/%q", o.name)
			}
		}
		b.WriteString("]\n")
	}
	names := make([]string, 0, m.locks.len())
	for name := range m.locks.all() {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		b.WriteString(formatLock(m.info(name, m.locks.get(name))))
		b.WriteString("\n")
	}
	var waiting []string
	for k, v := range m.waitValues {
		waiting = append(waiting, fmt.Sprintf("waiting value %q/%d=%q", k.name, k.session, v))
	}
	slices.Sort(waiting)
	for _, w := range waiting {
		b.WriteString(w + "\n")
	}
	return b.String()
}

func formatLock(li LockInfo) string {
	if li.Holder == 0 {
		return fmt.Sprintf("%q: free", li.Name)
	}
	s := fmt.Sprintf("%q: holder=%d token=%d", li.Name, li.Holder, li.Token)
	if len(li.Waiters) > 0 {
		s += fmt.Sprintf(" waiters=%v", li.Waiters)
	}
	if li.Value != nil {
		s += fmt.Sprintf(" value=%q", li.Value)
	}
	return s
}

// checkInvariants verifies that the structures of m agree with one another
// and with the limits, and the safety invariants of DESIGN.md (1, 8): one
// holder per lock, every holder and waiter a live session, no session both
// holding and waiting for a lock.
func checkInvariants(m *Machine) error {
	if len(m.sessions) > m.lim.MaxSessions {
		return fmt.Errorf("%d sessions over the limit %d", len(m.sessions), m.lim.MaxSessions)
	}
	for name := range m.values {
		if _, held := m.locks.lookup(name); !held {
			return fmt.Errorf("value kept for free lock %q", name)
		}
	}
	for k := range m.waitValues {
		if !slices.Contains(m.queues[k.name], k.session) {
			return fmt.Errorf("value kept for session %d, which does not wait for %q", k.session, k.name)
		}
	}
	for name, l := range m.locks.all() {
		if l.holder == 0 || l.token == 0 || l.token > m.applied {
			return fmt.Errorf("lock %q: holder %d token %d (applied %d)", name, l.holder, l.token, m.applied)
		}
		hs, ok := m.sessions[l.holder]
		if !ok {
			return fmt.Errorf("lock %q: holder %d is not a live session", name, l.holder)
		}
		if !hs.names.has(name) {
			return fmt.Errorf("lock %q: holder %d does not list it", name, l.holder)
		}
		q, ok := m.queues[name]
		if !ok {
			continue
		}
		if len(q) == 0 {
			return fmt.Errorf("lock %q: empty queue not dropped", name)
		}
		if len(q) > m.lim.MaxWaitersPerLock {
			return fmt.Errorf("lock %q: %d waiters over the limit", name, len(q))
		}
		seen := map[uint64]bool{}
		for _, w := range q {
			if w == l.holder {
				return fmt.Errorf("lock %q: session %d both holds and waits", name, w)
			}
			if seen[w] {
				return fmt.Errorf("lock %q: session %d waits twice", name, w)
			}
			seen[w] = true
			ws, ok := m.sessions[w]
			if !ok {
				return fmt.Errorf("lock %q: waiter %d is not a live session", name, w)
			}
			if !ws.names.has(name) {
				return fmt.Errorf("lock %q: waiter %d does not list it", name, w)
			}
		}
	}
	for name := range m.queues {
		if _, ok := m.locks.lookup(name); !ok {
			return fmt.Errorf("queue of free lock %q", name)
		}
	}
	withOpenID := 0
	for id, s := range m.sessions {
		if s.names.set != nil && s.names.list != nil {
			return fmt.Errorf("session %d: name set is both a list and a map", id)
		}
		if s.openID != 0 {
			withOpenID++
			if got := m.opens[s.openID]; got != id {
				return fmt.Errorf("session %d: open ID %d maps to session %d", id, s.openID, got)
			}
		}
		names := s.names.sorted()
		if len(slices.Compact(slices.Clone(names))) != len(names) {
			return fmt.Errorf("session %d: duplicate names %v", id, names)
		}
		if len(names) > m.lim.MaxLocksPerSession {
			return fmt.Errorf("session %d: %d locks over the limit", id, len(names))
		}
		for _, name := range names {
			l, ok := m.locks.lookup(name)
			if !ok {
				return fmt.Errorf("session %d: lists free lock %q", id, name)
			}
			if l.holder != id && !slices.Contains(m.queues[name], id) {
				return fmt.Errorf("session %d: lists lock %q it neither holds nor waits for", id, name)
			}
		}
		entries := map[uint64]bool{}
		for _, o := range s.outcomes {
			entries[o.seq] = true
		}
		for _, h := range s.holes {
			entries[h] = true
		}
		if len(entries) > m.lim.MaxPendingPerSession {
			return fmt.Errorf("session %d: %d outcomes and holes over the limit", id, len(entries))
		}
		if s.hi < s.done || !slices.IsSorted(s.holes) || (len(s.holes) > 0 && (s.holes[0] < s.done || s.holes[len(s.holes)-1] >= s.hi)) {
			return fmt.Errorf("session %d: holes %v outside [done %d, hi %d)", id, s.holes, s.done, s.hi)
		}
		for i, o := range s.outcomes {
			if s.retired(o.seq) || o.seq == 0 || (i > 0 && o.seq <= s.outcomes[i-1].seq) {
				return fmt.Errorf("session %d: outcomes out of order or retired: done %d, %v", id, s.done, s.outcomes)
			}
		}
	}
	if len(m.opens) != withOpenID {
		return fmt.Errorf("%d open IDs indexed for %d sessions with one", len(m.opens), withOpenID)
	}
	return nil
}

func formatResult(r Result) string {
	s := r.Code.String()
	if r.Token != 0 {
		s += fmt.Sprintf(" token=%d", r.Token)
	}
	if r.Session != 0 {
		s += fmt.Sprintf(" session=%d", r.Session)
	}
	return s
}

func formatEvent(e Event) string {
	switch e.Kind {
	case EventGranted:
		return fmt.Sprintf("event granted session=%d name=%q token=%d", e.Session, e.Name, e.Token)
	case EventSessionEnded:
		return fmt.Sprintf("event session-ended session=%d", e.Session)
	}
	return fmt.Sprintf("event %v %+v", e.Kind, e)
}

// equalCommand compares commands, taking nil and empty IDs as equal.
func equalCommand(a, b Command) bool {
	if len(a.IDs) == 0 {
		a.IDs = nil
	}
	if len(b.IDs) == 0 {
		b.IDs = nil
	}
	return reflect.DeepEqual(a, b)
}
