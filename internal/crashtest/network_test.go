package crashtest

import (
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/raftnode"
)

// network routes raft messages between the running lives of the replicas.
// A replica whose links are cut neither sends nor receives.
type network struct {
	mu    sync.Mutex
	eps   map[uint64]*endpoint // the running life of each replica
	cut   map[uint64]bool
	snaps int // snapshots delivered
}

// endpoint is the Transport of one life of a replica.
type endpoint struct {
	nw   *network
	id   uint64
	node *raftnode.Node // set before the endpoint is attached
}

func (e *endpoint) Send(msgs []*raftpb.Message) {
	for _, m := range msgs {
		e.nw.route(e, m)
	}
}

func (nw *network) route(from *endpoint, m *raftpb.Message) {
	to := m.GetTo()
	nw.mu.Lock()
	dst := nw.eps[to]
	ok := nw.eps[from.id] == from && dst != nil && !nw.cut[from.id] && !nw.cut[to]
	snap := m.GetType() == raftpb.MsgSnap
	if ok && snap {
		nw.snaps++
	}
	nw.mu.Unlock()
	if !ok {
		if snap {
			from.node.ReportSnapshot(to, raft.SnapshotFailure)
		}
		return
	}
	dst.node.Step(proto.Clone(m).(*raftpb.Message))
	if snap {
		from.node.ReportSnapshot(to, raft.SnapshotFinish)
	}
}

func (nw *network) attach(e *endpoint) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.eps[e.id] = e
	delete(nw.cut, e.id)
}

func (nw *network) detach(id uint64) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	delete(nw.eps, id)
}

func (nw *network) setCut(ids []uint64, cut bool) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	for _, id := range ids {
		if cut {
			nw.cut[id] = true
		} else {
			delete(nw.cut, id)
		}
	}
}

func (nw *network) snapshotsDelivered() int {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return nw.snaps
}
