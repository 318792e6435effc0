package check

import (
	"github.com/quorumlock/quorumlock/verify/history"
)

// checkLease checks that the cluster never ends a session, or frees a lock
// it holds, while its client may still believe it holds it (DESIGN.md
// invariants 3 and 5). For every acknowledged grant g of session s, the
// time until which the cluster must keep it is beliefEnd: the first release
// s sent for it, s's first close, else the end of s's lease as the client
// computed it (Deadline: the send time of the last acknowledged heartbeat +
// TTL - margin), plus the margin when the client sent no close at all.
// Evidence that g is over (another grant of the lock, or a read showing
// another holder or none, begun after g was acknowledged) must not return
// before that time. Also the cluster may not tell a client its session is
// gone before it could have expired.
func checkLease(x *index, r *Report) {
	for _, name := range x.locks() {
		ops := x.byLock[name]
		reported := 0
		for _, g := range ops {
			if !(g.Kind == history.Acquire || g.Kind == history.Try) || g.Outcome != history.OK {
				continue
			}
			end := x.beliefEnd(name, g.Session, g.Token)
			for _, e := range ops {
				over := false
				switch {
				case (e.Kind == history.Acquire || e.Kind == history.Try) && e.Outcome == history.OK:
					over = (e.Session != g.Session || e.Token != g.Token) && (e.Token > g.Token || e.Call > g.Return)
				case e.Kind == history.Read && e.Return != history.Open:
					over = (e.Holder != g.Session || e.Token != g.Token) && (e.Token > g.Token || e.Call > g.Return)
				}
				if !over || e.Return >= end {
					continue
				}
				if reported < 5 {
					what := "a read saw the lock free"
					if e.Holder != 0 || e.Kind != history.Read {
						who := e.Holder
						if e.Kind != history.Read {
							who = e.Session
						}
						what = "session " + itoa(who) + " held it with token " + itoa(e.Token)
					}
					r.add(Lease, name, "session %d's grant (token %d, acquired at %s) was over by %s (%s), but the cluster had to keep it until %s (%s)",
						g.Session, g.Token, ms(g.Return), ms(e.Return), what, ms(end), whyEnd(x, name, g))
				}
				reported++
			}
		}
	}
	for _, s := range x.h.Sessions {
		if s.Cause != history.EndCluster || s.Ended == 0 {
			continue
		}
		lo, _, _ := endBounds(s)
		if s.Ended < lo {
			r.add(Lease, "", "session %d was reported gone at %s, before it could expire at %s (last lease deadline %s + margin)",
				s.ID, ms(s.Ended), ms(lo), ms(s.Deadline))
		}
	}
}

func whyEnd(x *index, lock string, g history.Op) string {
	if t, ok := x.released[grant{lock, g.Session, g.Token}]; ok && t == x.beliefEnd(lock, g.Session, g.Token) {
		return "its release was sent then"
	}
	s := x.sessions[g.Session]
	if s == nil {
		return "unknown session"
	}
	if s.CloseCall != 0 && s.CloseCall <= s.Deadline {
		return "its session's close was sent then"
	}
	if s.Ended == 0 {
		return "its session was alive at the end"
	}
	return "its session's lease: deadline " + ms(s.Deadline) + ", ended for the client by " + s.Cause
}

func itoa(v uint64) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}
