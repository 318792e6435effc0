package crashtest

import (
	"fmt"
	"testing"

	"go.etcd.io/raft/v3"

	"github.com/quorumlock/quorumlock/raftnode"
)

const (
	clients = 5
	locks   = 3
)

// snapOptions make every replica take a snapshot every 16 entries and keep
// 4 entries behind it, so that snapshots and compactions happen all the
// time and a replica that was down for a while needs the leader's snapshot.
var snapOptions = options{snapshotEntries: 16, catchUpEntries: 4}

// TestCrashReadyLoop crashes the leader, a follower, or every replica at
// once (when the leader, or a follower, reaches the point) at each step of
// the Ready contract, under a running workload, and restarts the victims
// from what their file systems had synced:
//
//   - before-save: the Ready's hard state and entries are lost (the clone
//     is taken before its Save, in a Ready that saves entries);
//   - after-save: they are durable, but (on a follower) no message of the
//     Ready left;
//   - after-send: the messages left, the committed entries are not applied;
//   - after-apply: the entries are applied and the leader's waiters
//     answered, raft is not advanced.
//
// A leader passes the points in the order before-save, after-send,
// after-apply, after-save (it replicates and applies while it writes, raft
// thesis §10.2.1), so a leader crashing at after-send or after-apply has
// sent entries it never saved: the followers may commit them without it.
//
// After the restart the workload goes on (new grants after the crash), then
// stops, and every replica must hold exactly what the clients were told
// (no acknowledged grant, release or session lost), each lock's tokens must
// strictly increase over the whole history with never two holders, and no
// replica may apply an entry at an index where another entry was applied
// before, in any life.
func TestCrashReadyLoop(t *testing.T) {
	points := []string{
		raftnode.FailpointBeforeSave,
		raftnode.FailpointAfterSave,
		raftnode.FailpointAfterSend,
		raftnode.FailpointAfterApply,
	}
	seed := uint64(0)
	for _, point := range points {
		for _, v := range victims {
			seed++
			t.Run(point+"/"+v.String(), func(t *testing.T) {
				t.Parallel()
				crashAndRestart(t, options{}, point, v, nil, seed)
			})
		}
	}
}

// TestCrashSnapshot crashes the leader, a follower, or every replica at
// once (when the leader, or a follower, reaches the point) just before and
// just after a snapshot it took is saved (in the latter case before the log
// behind it is compacted), and checks as TestCrashReadyLoop does. A single victim stays down while the others
// snapshot and compact past its log, so it also rejoins through the
// leader's snapshot.
func TestCrashSnapshot(t *testing.T) {
	taken := false
	seed := uint64(100)
	for _, point := range []string{raftnode.FailpointBeforeSnapshotSave, raftnode.FailpointAfterSnapshotSave} {
		for _, v := range victims {
			seed++
			t.Run(point+"/"+v.String(), func(t *testing.T) {
				t.Parallel()
				crashAndRestart(t, snapOptions, point, v, &taken, seed)
			})
		}
	}
}

// TestCrashReceivedSnapshot takes a follower down until the others have
// compacted past its log, restarts it, and crashes it again while it saves
// the snapshot the leader sends: before the snapshot is durable, and after
// it is durable but before the Ready's hard state and entries are saved and
// before the state machine is restored from it. Restarted once more, the
// follower must come back and the checks of TestCrashReadyLoop hold.
func TestCrashReceivedSnapshot(t *testing.T) {
	received := true
	seed := uint64(200)
	for _, point := range []string{raftnode.FailpointBeforeSnapshotSave, raftnode.FailpointAfterSnapshotSave} {
		seed++
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, snapOptions)
			lead := c.waitLeader()
			w := startWorkload(c, seed, clients, locks)
			w.waitOps(20)
			follower := c.ids[0]
			if follower == lead.rep.id {
				follower = c.ids[1]
			}
			// Everything the follower can hold is at most the leader's log
			// at the crash; once the leader has compacted past it, the
			// follower can only rejoin through a snapshot.
			top := lastIndex(t, lead.store)
			c.crashNow(follower)
			w.waitOps(80)
			c.waitFor(fmt.Sprintf("the leader to compact past index %d", top), func() bool {
				l := c.readyLeader()
				return l != nil && firstIndex(t, l.store) > top+1
			})
			p := c.armReplica(follower, point, &received)
			before := c.nw.snapshotsDelivered()
			c.restart([]uint64{follower})
			ev, stopped := c.awaitCrash(p)
			if c.nw.snapshotsDelivered() == before {
				t.Fatalf("replica %d crashed at %s without a snapshot delivered to it", follower, point)
			}
			restarted := c.restart(p.victims)
			t.Logf("replica %d (life %d) crashed at %s saving the leader's snapshot; its store had %s when it stopped; it restarted from its crash image with %s",
				follower, ev.life, point, stopped[follower], restarted[follower])
			w.waitOps(40)
			commit := w.verify()
			t.Logf("%d requests answered, %d grants, commit index %d, %d snapshots delivered",
				w.ops.Load(), w.grantCount(), commit, c.nw.snapshotsDelivered())
		})
	}
}

func lastIndex(t *testing.T, s raft.Storage) uint64 {
	t.Helper()
	i, err := s.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	return i
}

func firstIndex(t *testing.T, s raft.Storage) uint64 {
	t.Helper()
	i, err := s.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// crashAndRestart runs the workload on a fresh cluster, crashes v at point
// (a snapshot point: only for a snapshot taken, or received, as received
// says), restarts the victims from their crash images, runs the workload
// on, and verifies.
func crashAndRestart(t *testing.T, opt options, point string, v victim, received *bool, seed uint64) {
	c := newCluster(t, opt)
	c.waitLeader()
	w := startWorkload(c, seed, clients, locks)
	w.waitOps(40)
	p, ev, stopped := c.armAndAwait(point, v, received)
	if !v.all() {
		// The others go on without the victim (electing a new leader if
		// it was the leader).
		w.waitOps(30)
	}
	restarted := c.restart(p.victims)
	restartedAt := w.h.now.Load()
	w.waitGrant("a grant after the restart", restartedAt)
	w.waitOps(40)
	commit := w.verify()
	for _, id := range p.victims {
		// Without snapshots a restarted replica applies its log again from
		// the start: every entry it had applied is compared.
		again := c.log.reappliedBy(id)
		if opt.snapshotEntries == 0 && again == 0 {
			t.Errorf("replica %d applied no index again after its restart", id)
		}
		t.Logf("replica %d (life %d) crashed at %s (target %d as %v): its store had %s when it stopped; it restarted from its crash image with %s and applied %d entries again, identical",
			id, ev.life, ev.point, ev.target, ev.role, stopped[id], restarted[id], again)
	}
	t.Logf("%d requests answered, %d grants (%d after the restart), commit index %d, %d snapshots delivered",
		w.ops.Load(), w.grantCount(), w.h.grantsSince(restartedAt), commit, c.nw.snapshotsDelivered())
}
