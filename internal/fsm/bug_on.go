//go:build fsmbug

package fsm

import (
	"fmt"
	"os"
)

// A build with the tag fsmbug is a deliberately broken state machine for
// verify's self-test (verify/harness/selftest_fsmbug_test.go): it proves
// that the checkers report a bug of the real state machine, not only of
// the Fake. Never ship such a build. The bugs are off until SetBug or the
// environment variable QUORUMLOCK_FSM_BUG switches one on:
//
//   - "double-grant": an Acquire or TryAcquire of a lock held by another
//     session is granted (the holder is not checked) when its entry's
//     index is even;
//   - "token-reuse": a lock handed to its next waiter keeps the token of
//     the grant it replaces.
//
// Both depend only on the log, so every replica applies them alike.
var bugDoubleGrant, bugTokenReuse bool

func init() {
	if err := SetBug(os.Getenv("QUORUMLOCK_FSM_BUG")); err != nil {
		panic(err)
	}
}

// Bugs are the names SetBug accepts, besides "" (no bug).
var Bugs = []string{"double-grant", "token-reuse"}

// SetBug switches on the named bug ("" switches every bug off). Set it
// before the replicas start: it is read by Apply without synchronisation.
func SetBug(name string) error {
	switch name {
	case "":
		bugDoubleGrant, bugTokenReuse = false, false
	case "double-grant":
		bugDoubleGrant, bugTokenReuse = true, false
	case "token-reuse":
		bugDoubleGrant, bugTokenReuse = false, true
	default:
		return fmt.Errorf("fsm: unknown bug %q (known: %v)", name, Bugs)
	}
	return nil
}
