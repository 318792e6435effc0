// Package crashtest holds crash-recovery tests of a whole replica: the
// Pebble log store on a crashable in-memory file system, the raft node and
// the lock service, three of them on an in-memory network. A test stops a
// replica (or all of them) at one of raftnode's failpoints, keeps only what
// its file system had synced at that instant (vfs.MemFS.CrashClone), restarts
// it from that image, and checks that nothing acknowledged was lost and no
// fencing token was issued twice (DESIGN.md invariants 2, 6 and 10).
//
// The package has no code outside its tests.
package crashtest
