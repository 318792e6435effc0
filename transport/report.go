package transport

import (
	"context"
	"maps"
	"slices"
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// reporter makes the Unreachable and SnapshotStatus calls from one goroutine,
// so that Send never calls back into the raft driver and a burst of drops to
// one peer turns into one call.
type reporter struct {
	onUnreachable func(id uint64)
	onSnapshot    func(id uint64, status raft.SnapshotStatus)

	mu                 sync.Mutex
	pendingUnreachable map[uint64]struct{}
	pendingSnapshots   map[uint64]raft.SnapshotStatus // latest status per peer
	kick               chan struct{}                  // capacity 1: work is pending
}

func newReporter(onUnreachable func(uint64), onSnapshot func(uint64, raft.SnapshotStatus)) *reporter {
	return &reporter{
		onUnreachable:      onUnreachable,
		onSnapshot:         onSnapshot,
		pendingUnreachable: make(map[uint64]struct{}),
		pendingSnapshots:   make(map[uint64]raft.SnapshotStatus),
		kick:               make(chan struct{}, 1),
	}
}

// unreachable schedules an Unreachable(id) call. It never blocks.
func (r *reporter) unreachable(id uint64) {
	if r.onUnreachable == nil {
		return
	}
	r.mu.Lock()
	r.pendingUnreachable[id] = struct{}{}
	r.mu.Unlock()
	r.wake()
}

// snapshotFailed and snapshotSent schedule a SnapshotStatus(id, ...) call.
// They never block.
func (r *reporter) snapshotFailed(id uint64) { r.snapshot(id, raft.SnapshotFailure) }
func (r *reporter) snapshotSent(id uint64)   { r.snapshot(id, raft.SnapshotFinish) }

func (r *reporter) snapshot(id uint64, st raft.SnapshotStatus) {
	if r.onSnapshot == nil {
		return
	}
	r.mu.Lock()
	r.pendingSnapshots[id] = st
	r.mu.Unlock()
	r.wake()
}

func (r *reporter) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// run makes the scheduled calls until ctx is done, in ascending peer order
// within one round. Calls still pending when ctx is done are not made.
func (r *reporter) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}
		r.mu.Lock()
		unreachable, snapshots := r.pendingUnreachable, r.pendingSnapshots
		r.pendingUnreachable = make(map[uint64]struct{}, len(unreachable))
		r.pendingSnapshots = make(map[uint64]raft.SnapshotStatus, len(snapshots))
		r.mu.Unlock()

		for _, id := range slices.Sorted(maps.Keys(unreachable)) {
			if ctx.Err() != nil {
				return
			}
			r.onUnreachable(id)
		}
		for _, id := range slices.Sorted(maps.Keys(snapshots)) {
			if ctx.Err() != nil {
				return
			}
			r.onSnapshot(id, snapshots[id])
		}
	}
}

// isSnapshot reports whether m carries a snapshot; such messages travel on
// the Peer.Snapshot stream, and their outcome is reported through
// SnapshotStatus.
func isSnapshot(m *raftpb.Message) bool {
	return m.GetType() == raftpb.MsgSnap
}
