package check

import (
	"github.com/quorumlock/quorumlock/verify/history"
)

// checkFinal checks the lock table and the session list read after the
// faults were healed, the workload stopped and every session whose client
// saw it end had time to expire (reads marked Final, sessions'
// ListedAtEnd):
//
//  1. every lock has a final read;
//  2. a lock's final holder is a session that is alive, to its client and
//     to the cluster, and holds it under a token it was granted (or may
//     have been, by an ambiguous acquire), which it never released with an
//     acknowledgement;
//  3. every acknowledged acquire of a session alive at the end, never
//     released, is the lock's final grant (no acknowledged acquire lost);
//  4. no waiters are left: every acquire was settled, so only the queue
//     places of ended sessions could remain, and those were removed;
//  5. the cluster lists exactly the sessions alive to their clients:
//     none that ended (they stopped heartbeating at least a TTL ago), and
//     all that are alive.
func checkFinal(x *index, r *Report) {
	for _, name := range x.locks() {
		var final *history.Op
		granted := make(map[grant]bool)    // acknowledged acquires
		ambiguous := make(map[uint64]bool) // sessions with an ambiguous acquire
		releasedOK := make(map[grant]bool)
		releasedAny := make(map[grant]bool)
		last := make(map[uint64]history.Op) // each session's last acknowledged grant
		for _, op := range x.byLock[name] {
			switch {
			case op.Kind == history.Read && op.Final:
				o := op
				if final == nil || o.Call > final.Call {
					final = &o
				}
			case (op.Kind == history.Acquire || op.Kind == history.Try) && op.Outcome == history.OK:
				granted[grant{name, op.Session, op.Token}] = true
				if l, ok := last[op.Session]; !ok || op.Token >= l.Token {
					last[op.Session] = op
				}
			case (op.Kind == history.Acquire || op.Kind == history.Try) && op.Outcome == history.Ambiguous:
				ambiguous[op.Session] = true
			case op.Kind == history.Release:
				g := grant{name, op.Session, op.Token}
				releasedAny[g] = true
				if op.Outcome == history.OK {
					releasedOK[g] = true
				}
			}
		}
		if final == nil {
			r.add(Final, name, "no final read of the lock table")
			continue
		}
		if h := final.Holder; h != 0 {
			g := grant{name, h, final.Token}
			s := x.sessions[h]
			switch {
			case s == nil:
				r.add(Final, name, "held at the end by session %d, which no client opened", h)
			case s.Ended != 0:
				r.add(Final, name, "held at the end by session %d (token %d), which its client saw end at %s (%s)", h, final.Token, ms(s.Ended), s.Cause)
			case !s.ListedAtEnd:
				r.add(Final, name, "held at the end by session %d, which the cluster does not list", h)
			}
			if !granted[g] && !ambiguous[h] {
				r.add(Final, name, "held at the end by session %d under token %d, which it was never granted", h, final.Token)
			}
			if releasedOK[g] {
				r.add(Final, name, "held at the end by session %d under token %d, whose release was acknowledged", h, final.Token)
			}
		}
		for sid, op := range last {
			s := x.sessions[sid]
			if s == nil || s.Ended != 0 || s.CloseCall != 0 || !s.ListedAtEnd {
				continue
			}
			g := grant{name, sid, op.Token}
			if releasedAny[g] {
				continue
			}
			if final.Holder != sid || final.Token != op.Token {
				r.add(Final, name, "acknowledged acquire lost: session %d (alive) was granted token %d at %s and never released it, but the final holder is session %d token %d",
					sid, op.Token, ms(op.Return), final.Holder, final.Token)
			}
		}
		if len(final.Waiters) > 0 {
			r.add(Final, name, "waiters left at the end: %v", final.Waiters)
		}
	}
	for _, s := range x.h.Sessions {
		switch {
		case s.Ended != 0 && s.ListedAtEnd:
			r.add(Final, "", "session %d ended for its client at %s (%s) but the cluster still lists it", s.ID, ms(s.Ended), s.Cause)
		case s.Ended == 0 && s.CloseCall == 0 && !s.ListedAtEnd:
			r.add(Final, "", "session %d is alive for its client but the cluster does not list it", s.ID)
		}
	}
}
