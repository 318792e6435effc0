// Package testhook gives the project's test harnesses (verify/) operations
// on a running replica that are not part of the public API. Package
// quorumlock installs them when it is initialised; only packages inside
// this module can import this one.
package testhook

// transfer is installed by package quorumlock.
var transfer func(n any, to uint64) bool

// SetTransferLeadership installs the implementation of TransferLeadership
// (package quorumlock calls it from init).
func SetTransferLeadership(f func(n any, to uint64) bool) { transfer = f }

// TransferLeadership asks replica n, a *quorumlock.Node, to hand raft
// leadership to member to (raft's leadership transfer, MsgTimeoutNow:
// the transferee campaigns at once), without stopping n. It never blocks
// and returns false if n is not a running *quorumlock.Node. Raft ignores
// the request unless n leads, and abandons a transfer that has not
// finished within an election timeout.
func TransferLeadership(n any, to uint64) bool {
	if transfer == nil {
		return false
	}
	return transfer(n, to)
}
