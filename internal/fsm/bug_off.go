//go:build !fsmbug

package fsm

// The deliberate bugs of verify's self-test (bug_on.go) exist only in a
// build with the tag fsmbug; in every other build they are constant false
// and the compiler drops the code they guard.
const (
	bugDoubleGrant = false
	bugTokenReuse  = false
)
