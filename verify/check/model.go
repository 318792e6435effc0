package check

import (
	"fmt"
	"hash/fnv"

	"github.com/anishathalye/porcupine"

	"github.com/quorumlock/quorumlock/verify/history"
)

// kindEnd is the pseudo-operation "the session ended" (closed, expired or
// revoked on the cluster): the checker adds one per session and lock, with a
// window from the earliest time the cluster may end the session to the
// latest time it is known to have ended (see Session bounds in doc.go).
const kindEnd history.Kind = "end"

// input is one operation as the model sees it.
type input struct {
	Kind    history.Kind
	Outcome history.Outcome
	Session uint64
	Bit     int    // the session's bit in state.dead
	Token   uint64 // acquire: granted; release: released; read: observed
	Holder  uint64 // read: observed holder (0 = free)
}

// state is the model of one lock: its holder and token, the highest token
// granted so far in the linearization, and the sessions that have ended.
type state struct {
	holder uint64
	token  uint64 // 0: granted by an ambiguous acquire, token not yet seen
	floor  uint64 // highest token known to have been granted
	dead   string // bitset of ended sessions (by input.Bit)
	// amb: the grant was made by an ambiguous acquire and no acquire of
	// its session has returned it since (a withdrawal's release may free
	// it: see step).
	amb bool
}

func (s state) isDead(bit int) bool {
	return bit/8 < len(s.dead) && s.dead[bit/8]&(1<<(bit%8)) != 0
}

func (s state) withDead(bit int) state {
	b := []byte(s.dead)
	for len(b) <= bit/8 {
		b = append(b, 0)
	}
	b[bit/8] |= 1 << (bit % 8)
	s.dead = string(b)
	return s
}

// step is the sequential specification of one lock (quorumlock's fsm, as
// far as one lock is concerned):
//
//   - acquire/try ok(T): the session is alive; the lock is free and T is
//     above every token granted before (a new grant), or the session
//     already holds it under T (re-entrant acquire);
//   - try locked: another session holds the lock;
//   - acquire cancelled: no effect (settled as withdrawn);
//   - release ok(T): the session holds the lock under T; frees it;
//   - release not-held(T): the session does not hold it under T;
//   - read (h, T): the lock is held by h under T (or free, h = 0);
//   - end(s): the session ends; its lock, if it holds it, is freed;
//   - ambiguous acquire: if the session is alive and the lock free, grants
//     it (token unknown until a read shows it); otherwise no effect;
//   - ambiguous release(T): frees the lock if the session holds it under T;
//   - ambiguous release(0), the background withdrawal of an acquire that
//     returned ErrWithdrawPending (it releases a grant that won the race):
//     frees the lock if the session holds it by an ambiguous acquire that
//     no acquire of the session has returned since.
//
// An ambiguous operation never returns, so the checker may place it at any
// point after its call, including after everything else, where its effect
// does not matter: that covers "never applied".
func step(st state, in input) (bool, state) {
	switch in.Kind {
	case history.Acquire, history.Try:
		switch in.Outcome {
		case history.OK:
			if st.isDead(in.Bit) {
				return false, st
			}
			if st.holder == in.Session {
				if st.token == in.Token {
					st.amb = false
					return true, st
				}
				if st.token == 0 && in.Token > st.floor {
					st.token, st.floor, st.amb = in.Token, in.Token, false
					return true, st
				}
				return false, st
			}
			if st.holder != 0 || in.Token <= st.floor {
				return false, st
			}
			st.holder, st.token, st.floor, st.amb = in.Session, in.Token, in.Token, false
			return true, st
		case history.Locked:
			return st.holder != 0 && st.holder != in.Session && !st.isDead(in.Bit), st
		case history.Ambiguous:
			if st.holder == 0 && !st.isDead(in.Bit) {
				st.holder, st.token, st.amb = in.Session, 0, true
			}
			return true, st
		default: // cancelled
			return true, st
		}
	case history.Release:
		if in.Token == 0 {
			if in.Outcome == history.Ambiguous && st.holder == in.Session && st.amb {
				st.holder, st.token, st.floor, st.amb = 0, 0, max(st.floor, st.token), false
			}
			return in.Outcome == history.Ambiguous, st
		}
		holds := st.holder == in.Session && (st.token == in.Token || st.token == 0)
		switch in.Outcome {
		case history.OK:
			if !holds || st.isDead(in.Bit) {
				return false, st
			}
			st.holder, st.token, st.floor, st.amb = 0, 0, max(st.floor, in.Token), false
			return true, st
		case history.NotHeld:
			return !(st.holder == in.Session && st.token == in.Token), st
		default: // ambiguous
			if holds {
				st.holder, st.token, st.floor, st.amb = 0, 0, max(st.floor, in.Token), false
			}
			return true, st
		}
	case history.Read:
		if in.Holder == 0 {
			return st.holder == 0, st
		}
		if st.holder != in.Holder || st.isDead(in.Bit) {
			return false, st
		}
		if st.token == in.Token {
			return true, st
		}
		if st.token == 0 && in.Token > st.floor {
			st.token, st.floor = in.Token, in.Token
			return true, st
		}
		return false, st
	case kindEnd:
		st = st.withDead(in.Bit)
		if st.holder == in.Session {
			st.holder, st.token, st.amb = 0, 0, false
		}
		return true, st
	}
	return false, st
}

// lockModel is the porcupine model of one lock.
var lockModel = porcupine.Model{
	Init: func() interface{} { return state{} },
	Step: func(s, in, _ interface{}) (bool, interface{}) {
		return step(s.(state), in.(input))
	},
	Equal: func(a, b interface{}) bool { return a.(state) == b.(state) },
	Hash: func(s interface{}) uint64 {
		st := s.(state)
		h := fnv.New64a()
		fmt.Fprintf(h, "%d/%d/%d/%s/%t", st.holder, st.token, st.floor, st.dead, st.amb)
		return h.Sum64()
	},
	DescribeOperation: func(in, _ interface{}) string {
		i := in.(input)
		switch i.Kind {
		case history.Read:
			if i.Holder == 0 {
				return "read -> free"
			}
			return fmt.Sprintf("read -> s%d t%d", i.Holder, i.Token)
		case kindEnd:
			return fmt.Sprintf("end s%d", i.Session)
		case history.Release:
			if i.Token == 0 {
				return fmt.Sprintf("s%d release of a withdrawn acquire's grant -> %s", i.Session, i.Outcome)
			}
			return fmt.Sprintf("s%d release t%d -> %s", i.Session, i.Token, i.Outcome)
		default:
			if i.Outcome == history.OK {
				return fmt.Sprintf("s%d %s -> t%d", i.Session, i.Kind, i.Token)
			}
			return fmt.Sprintf("s%d %s -> %s", i.Session, i.Kind, i.Outcome)
		}
	},
	DescribeState: func(s interface{}) string {
		st := s.(state)
		if st.holder == 0 {
			return fmt.Sprintf("free (floor t%d)", st.floor)
		}
		if st.token == 0 {
			return fmt.Sprintf("s%d t? (floor t%d)", st.holder, st.floor)
		}
		return fmt.Sprintf("s%d t%d", st.holder, st.token)
	},
}
