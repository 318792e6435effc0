package check

import (
	"slices"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/quorumlock/quorumlock/verify/history"
)

// checkLinearizable checks every lock's history against the model with
// porcupine. A history of several locks is linearizable only if each
// lock's projection is, so a violation on one lock is a real violation; the
// converse does not hold (a session's close ends all its locks at once,
// which the per-lock projection cannot see), which makes this check
// weaker than a whole-history one, never wrong.
func checkLinearizable(x *index, r *Report, opts Options) {
	start := time.Now()
	defer func() { r.LinTime = time.Since(start) }()
	for _, name := range x.locks() {
		ops := lockOperations(x, name)
		r.Ops += len(ops)
		r.PerLock[name] = len(ops)
		if len(ops) > opts.MaxOpsPerLock {
			r.add(Linearizable, name, "%d operations: more than %d, too many to check", len(ops), opts.MaxOpsPerLock)
			continue
		}
		res, info := porcupine.CheckOperationsVerbose(lockModel, ops, opts.Timeout)
		r.infos[name] = info
		switch res {
		case porcupine.Ok:
		case porcupine.Illegal:
			r.add(Linearizable, name, "history of %d operations is not linearizable (see the visualization)", len(ops))
		default:
			r.add(Linearizable, name, "porcupine found no answer within %v for %d operations", opts.Timeout, len(ops))
		}
	}
}

// lockOperations converts one lock's history into porcupine operations,
// adding a session-end pseudo-operation for every session that acted on
// the lock or was seen holding it.
func lockOperations(x *index, name string) []porcupine.Operation {
	bits := make(map[uint64]int)
	bit := func(s uint64) int {
		b, ok := bits[s]
		if !ok {
			b = len(bits)
			bits[s] = b
		}
		return b
	}
	var out []porcupine.Operation
	rows := 0
	for _, op := range x.byLock[name] {
		rows = max(rows, op.Client+1)
		in := input{Kind: op.Kind, Outcome: op.Outcome, Session: op.Session, Token: op.Token, Holder: op.Holder}
		switch op.Kind {
		case history.Read:
			if op.Holder != 0 {
				in.Bit = bit(op.Holder)
			}
		default:
			in.Bit = bit(op.Session)
		}
		out = append(out, porcupine.Operation{
			ClientId: op.Client, Input: in, Call: op.Call, Output: nil, Return: ret(op),
			Metadata: op.Via + " " + op.Err,
		})
	}
	sessions := make([]uint64, 0, len(bits))
	for s := range bits {
		sessions = append(sessions, s)
	}
	slices.Sort(sessions)
	for _, id := range sessions {
		s := x.sessions[id]
		if s == nil {
			continue
		}
		lo, hi, ok := endBounds(s)
		if !ok {
			continue
		}
		hi = max(hi, lo)
		out = append(out, porcupine.Operation{
			ClientId: rows, Input: input{Kind: kindEnd, Session: id, Bit: bits[id]}, Call: lo, Return: hi,
			Metadata: "session " + s.Cause,
		})
		rows++
	}
	return out
}
