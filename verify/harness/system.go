package harness

import (
	"context"
	"time"
)

// A System is what a trial runs against: a real in-process cluster
// (NewCluster) or the self-test's in-memory lock service (NewFake). The
// workload reaches it only through Endpoints; the nemesis only through the
// fault methods. Errors are quorumlock's sentinels.
type System interface {
	// Endpoints returns the processes that host sessions: replicas first,
	// then remote clients. Their number never changes; an endpoint whose
	// process is stopped returns errors.
	Endpoints() []Endpoint
	// Members returns the replica IDs.
	Members() []uint64
	// Clients returns the network IDs of the remote clients (usable in
	// Partition groups).
	Clients() []uint64
	// Leader returns the current leader, or 0; WaitLeader waits up to d
	// for one.
	Leader() uint64
	WaitLeader(d time.Duration) uint64
	// ElectionTimeout is the raft election timeout.
	ElectionTimeout() time.Duration

	// Network faults between members (and clients, by their IDs).
	Isolate(id uint64)
	Partition(groups ...[]uint64)
	Cut(from, to uint64)
	SetDelay(from, to uint64, d time.Duration)
	SetDrop(from, to uint64, p float64)
	Heal()
	// Stop kills replica id in process (its sessions end on the client
	// side, without a close); Restart starts it again on its data.
	Stop(id uint64)
	// Shutdown stops replica id the way an operator does (Node.Close): a
	// leader hands leadership over first. Restart starts it again.
	Shutdown(id uint64)
	Restart(id uint64) error
	// Running returns the replicas that are not stopped.
	Running() []uint64
	// CrashClient closes remote client i (its sessions end without a
	// close) and dials a new one in its place.
	CrashClient(i int) error

	// Probe makes one acquire through a replica not in avoid and returns
	// when it succeeded (availability measurement).
	Probe(ctx context.Context, avoid []uint64) error
	// LiveSessions lists the sessions the cluster holds, except the
	// harness's own (probes).
	LiveSessions(ctx context.Context) (map[uint64]bool, error)
	// Read is a linearizable read of a lock through a healthy path.
	Read(ctx context.Context, name string) (Info, error)
	// Close stops everything.
	Close()
}

// Endpoint is a process that hosts sessions: a replica or a remote client.
type Endpoint interface {
	Name() string
	NewSession(ctx context.Context) (Session, error)
	Holder(ctx context.Context, name string) (Info, error)
}

// Info is a lock's state as a linearizable read returns it.
type Info struct {
	Holder  uint64
	Token   uint64
	Waiters []uint64
}

// Session is a quorumlock.Session as the workload uses it.
type Session interface {
	ID() uint64
	TTL() time.Duration
	Acquire(ctx context.Context, name string) (Lock, error)
	TryAcquire(ctx context.Context, name string) (Lock, error)
	Close(ctx context.Context) error
	Deadline() time.Time
	Done() <-chan struct{}
	Err() error
}

// Lock is a quorumlock.Lock as the workload uses it.
type Lock interface {
	Token() uint64
	Release(ctx context.Context) error
	Lost() <-chan struct{}
}

// Pauser is a System whose processes can be paused like SIGSTOP/SIGCONT
// (Cluster; the Fake cannot): the pause-leader and pause-holder faults
// need it.
type Pauser interface {
	// Pause freezes the process named by an endpoint name (r<id>, c<i>):
	// its clock, its links and its clients; Resume thaws it.
	Pause(name string) error
	Resume(name string)
	// Gate holds a client of the named process while it is paused; Held
	// counts the calls it held.
	Gate(name string)
	Held(name string) int64
	// View returns the leader replica id believes in (0: none, or it does
	// not answer).
	View(id uint64) uint64
	// How names how the named process is paused ("SIGSTOP", "in
	// process").
	How(name string) string
}

// Transferrer is a System whose leader can hand leadership over without
// stopping (raft's leadership transfer): the leader-transfer fault needs
// it.
type Transferrer interface {
	TransferLeader(from, to uint64) bool
}
