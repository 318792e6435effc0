// Package harness runs verification trials of quorumlock: it starts a
// real in-process cluster (internal/testcluster: replicas with raft,
// Pebble and gRPC on loopback, links that can be cut, delayed and made
// lossy) with remote clients (quorumlock.Dial over the same faulty
// network), runs a workload of concurrent sessions on a few lock names,
// and lets a nemesis carry out a seeded fault plan meanwhile. Then it
// heals, waits for the cluster to settle, reads the final lock table and
// hands the recorded history to package check.
//
// A trial is a function of its seed as far as the plan goes: the cluster
// size, the session TTL, the fault kinds, their order, holds and pauses,
// and their random choices (which replicas, which links, how the
// partition splits) are drawn from it. Targets named by role, such as
// "the leader", are resolved when the step runs, and the timing of the
// clients and of the replicas is not replayed.
//
// Leadership churn isolates the current leader for 3 election timeouts
// every TTL/2 (an election); leader hand-off shuts the leader down with
// Node.Close every TTL/2 (raft's leadership transfer) and restarts it;
// leader transfer hands leadership to a follower every TTL/2 with the old
// leader staying up (internal/testhook). Pauses of the leader or of a
// holder's process (SIGSTOP/SIGCONT) are emulated in process: the
// process's clock stops, its links stall and its clients stop at their
// next fenced write (pause.go).
//
// Procs runs the trial against separate lockd processes instead
// (internal/proctest): real SIGKILL, SIGTERM and SIGSTOP/SIGCONT of
// replicas and SIGKILL at a raft Ready-loop point (CrashPoint), no
// network faults (ProcFaults).
//
// The self-test runs the same workload, nemesis, history and checkers
// against Fake, an in-memory lock service with quorumlock's client
// semantics that can be broken on purpose (Bug): a double grant, a
// reused token, acknowledged acquires that are lost, early expiry and a
// slow failover must each be reported by the checkers meant to catch
// them, and the correct Fake must pass.
//
// Environment: VERIFY_OUT names the folder for failed trials' artefacts
// in tests (default $TMPDIR/quorumlock-verify); VERIFY_DEBUG=1 logs the
// replicas at debug level and every probe attempt into the artefacts.
package harness
