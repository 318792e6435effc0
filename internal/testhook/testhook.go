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

// setFailpoint is installed by package quorumlock.
var setFailpoint func(cfg any, f func(point string)) bool

// SetFailpointSetter installs the implementation of SetFailpoint (package
// quorumlock calls it from init).
func SetFailpointSetter(f func(cfg any, f func(point string)) bool) { setFailpoint = f }

// SetFailpoint makes f the raft failpoint hook (raftnode's
// Config.Failpoint: called on the raft goroutine at every Failpoint* point
// of the Ready loop) of the replica that cfg, a *quorumlock.Config, will
// start; f nil removes it. It returns false if cfg is not a non-nil
// *quorumlock.Config. A program that installs one is a test build
// (examples/lockd with the tag crashpoint).
func SetFailpoint(cfg any, f func(point string)) bool {
	if setFailpoint == nil {
		return false
	}
	return setFailpoint(cfg, f)
}
