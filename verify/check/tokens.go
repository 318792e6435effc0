package check

import (
	"fmt"
	"slices"
	"time"

	"github.com/quorumlock/quorumlock/verify/history"
)

// checkTokens checks the fencing tokens of every lock (DESIGN.md invariant
// 2), from the grants clients were given and the holders reads saw:
//
//  1. a token names one grant: never two sessions with the same token;
//  2. a grant's token is above its session's ID (the index of the entry
//     that opened the session, which the grant follows in the log);
//  3. tokens increase in grant order: a grant whose acquire was called
//     after another grant was known (its acquire returned, or a read
//     returned it) has a larger token, unless it is the same grant
//     (re-entrant acquire). This holds across leader changes and
//     restarts, so it also proves that no token is reused after one.
func checkTokens(x *index, r *Report) {
	for _, name := range x.locks() {
		type obs struct {
			session, token uint64
			at             int64
		}
		var known []obs  // a grant known to exist by at
		var grants []obs // a grant made after at (acquire call)
		owner := make(map[uint64]uint64)
		for _, op := range x.byLock[name] {
			var s uint64
			switch {
			case (op.Kind == history.Acquire || op.Kind == history.Try) && op.Outcome == history.OK:
				s = op.Session
				grants = append(grants, obs{s, op.Token, op.Call})
			case op.Kind == history.Read && op.Holder != 0:
				s = op.Holder
			default:
				continue
			}
			known = append(known, obs{s, op.Token, op.Return})
			if o, ok := owner[op.Token]; ok && o != s {
				r.add(Tokens, name, "token %d granted to sessions %d and %d", op.Token, o, s)
			}
			owner[op.Token] = s
			if op.Token <= s {
				r.add(Tokens, name, "session %d holds token %d, not above its own ID", s, op.Token)
			}
		}
		slices.SortFunc(known, func(a, b obs) int { return cmp64(a.at, b.at) })
		slices.SortFunc(grants, func(a, b obs) int { return cmp64(a.at, b.at) })
		var top obs
		i, reported := 0, 0
		for _, g := range grants {
			for i < len(known) && known[i].at < g.at {
				if known[i].token > top.token {
					top = known[i]
				}
				i++
			}
			if top.token == 0 || g.token > top.token || (g.token == top.token && g.session == top.session) {
				continue
			}
			if reported < 5 {
				r.add(Tokens, name, "session %d was granted token %d by an acquire called at %s, after token %d (session %d) was known at %s",
					g.session, g.token, ms(g.at), top.token, top.session, ms(top.at))
			}
			reported++
		}
	}
}

func ms(t int64) string {
	if t == never {
		return "never"
	}
	return fmt.Sprintf("%.1fms", float64(t)/float64(time.Millisecond))
}
