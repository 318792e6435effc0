package fsm

import "strconv"

// String returns the op's name, such as "acquire", or "op(N)" for an unknown
// value.
func (o Op) String() string {
	switch o {
	case OpOpenSession:
		return "open-session"
	case OpAcquire:
		return "acquire"
	case OpRelease:
		return "release"
	case OpWithdraw:
		return "withdraw"
	case OpCloseSession:
		return "close-session"
	case OpExpire:
		return "expire"
	case OpProclaim:
		return "proclaim"
	case OpRevoke:
		return "revoke"
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// String returns the code's name, such as "queued", or "code(N)" for an
// unknown value.
func (c Code) String() string {
	switch c {
	case CodeOK:
		return "ok"
	case CodeQueued:
		return "queued"
	case CodeLocked:
		return "locked"
	case CodeNotHeld:
		return "not-held"
	case CodeNoSession:
		return "no-session"
	case CodeLimit:
		return "limit"
	case CodeInvalid:
		return "invalid"
	case CodeWithdrawn:
		return "withdrawn"
	case CodeStaleTerm:
		return "stale-term"
	}
	return "code(" + strconv.Itoa(int(c)) + ")"
}

// String returns the kind's name, "granted" or "session-ended", or "event(N)"
// for an unknown value.
func (k EventKind) String() string {
	switch k {
	case EventGranted:
		return "granted"
	case EventSessionEnded:
		return "session-ended"
	}
	return "event(" + strconv.Itoa(int(k)) + ")"
}
