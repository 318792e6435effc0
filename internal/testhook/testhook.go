// Package testhook gives the project's test harnesses (verify/) operations
// on a running replica that are not part of the public API. Package
// quorumlock installs them when it is initialised; only packages inside
// this module can import this one.
package testhook

import "sync"

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

var (
	fpMu       sync.Mutex
	failpoints = map[string]func(point string){}
)

// SetFailpoint installs f as the raft failpoint hook (raftnode's
// Config.Failpoint: called on the raft goroutine at every Failpoint* point
// of the Ready loop) of the replicas started from now on with data
// directory dir; dir "" applies to every replica without a hook of its
// own. f nil removes the hook. A program that installs one is a test
// build (examples/lockd with the tag crashpoint).
func SetFailpoint(dir string, f func(point string)) {
	fpMu.Lock()
	defer fpMu.Unlock()
	if f == nil {
		delete(failpoints, dir)
		return
	}
	failpoints[dir] = f
}

// Failpoint returns the hook for a replica with data directory dir, or nil
// (always, unless SetFailpoint was called).
func Failpoint(dir string) func(point string) {
	fpMu.Lock()
	defer fpMu.Unlock()
	if f, ok := failpoints[dir]; ok {
		return f
	}
	return failpoints[""]
}
