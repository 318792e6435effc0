package check

import (
	"slices"

	"github.com/quorumlock/quorumlock/verify/history"
)

// checkExclusion checks mutual exclusion as the fenced resource saw it:
//
//  1. in the order the Fence decided, no write with a lower token was
//     accepted after a higher one, and no write was rejected unless a
//     higher token had been accepted before (the Fence itself);
//  2. a token identifies one grant: two sessions never had writes
//     accepted under the same token of a lock (else the Fence cannot tell
//     a stale holder from the current one);
//  3. accepted writes of two different grants never overlap in time,
//     where both writers were within their grant's lease (the write ended
//     before its holder released the lock or its session could end, see
//     beliefEnd). A write that outlived its holder's lease and overlapped
//     a newer grant's is what fencing tokens are for: it is counted in
//     Report.LateWrites, not reported.
func checkExclusion(x *index, r *Report) {
	ws := slices.Clone(x.h.Writes)
	r.Writes = len(ws)
	slices.SortFunc(ws, func(a, b history.Write) int { return a.Seq - b.Seq })
	highest := make(map[string]uint64)
	owner := make(map[grant]uint64) // (lock, 0, token) -> session
	byLock := make(map[string][]history.Write)
	for _, w := range ws {
		h := highest[w.Lock]
		switch {
		case w.Accepted && w.Token < h:
			r.add(Exclusion, w.Lock, "write of session %d with token %d accepted after token %d", w.Session, w.Token, h)
		case !w.Accepted && w.Token >= h:
			r.add(Exclusion, w.Lock, "write of session %d with token %d rejected though the highest accepted was %d", w.Session, w.Token, h)
		}
		if !w.Accepted {
			r.Rejected++
			continue
		}
		highest[w.Lock] = max(h, w.Token)
		k := grant{lock: w.Lock, token: w.Token}
		if o, ok := owner[k]; ok && o != w.Session {
			r.add(Exclusion, w.Lock, "sessions %d and %d both wrote under token %d", o, w.Session, w.Token)
		}
		owner[k] = w.Session
		byLock[w.Lock] = append(byLock[w.Lock], w)
	}
	for lock, lw := range byLock {
		slices.SortFunc(lw, func(a, b history.Write) int { return cmp64(a.Start, b.Start) })
		inLease := func(w history.Write) bool { return w.End <= x.beliefEnd(lock, w.Session, w.Token) }
		reported := 0
		for i, a := range lw {
			for _, b := range lw[i+1:] {
				if b.Start > a.End {
					break
				}
				if a.Session == b.Session && a.Token == b.Token {
					continue
				}
				if !inLease(a) || !inLease(b) {
					r.LateWrites++
					continue
				}
				if reported < 5 {
					r.add(Exclusion, lock, "writes overlap: session %d token %d [%s, %s] and session %d token %d [%s, %s], both within their lease",
						a.Session, a.Token, ms(a.Start), ms(a.End), b.Session, b.Token, ms(b.Start), ms(b.End))
				}
				reported++
			}
		}
	}
}
