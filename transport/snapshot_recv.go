package transport

import (
	"errors"
	"hash/crc32"
	"io"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// serveSnapshot runs one inbound snapshot transfer (see "Snapshots" in
// doc.go): the handshake, the size bound, reassembly and the CRC check, then
// delivery to Handler and the acknowledgement. It ends the transfer when it
// stalls for SnapshotStallTimeout, when a newer transfer from the same
// member is accepted, or when t is closed.
func (t *Transport) serveSnapshot(stream lockpb.Peer_SnapshotServer) error {
	if !t.track() {
		return errClosed
	}
	defer t.wg.Done()

	stop := make(chan struct{})
	defer close(stop)
	chunks, recvErr := recvLoop(t, stream.Recv, stop)
	log := t.remoteLogger(stream.Context())

	first, err := awaitHello(stream.Context(), t, chunks, recvErr, log, "snapshot stream")
	if err != nil {
		return err
	}
	from := first.GetHello().GetFrom()
	log = log.With(zap.Uint64("peer", from))
	t.stats.snapshotChunksIn.Add(1)
	superseded := t.acceptSnapshot(from)
	defer t.releaseSnapshot(from, superseded)

	reject := func(err error) error {
		t.stats.snapshotsRejected.Add(1)
		log.Warn("rejected snapshot", zap.Uint64("total", first.GetTotal()), zap.Error(err))
		return err
	}
	r, err := newReassembly(first, from, t.cfg.ID, uint64(t.cfg.MaxSnapshotBytes))
	if err != nil {
		return reject(err)
	}
	timer := time.NewTimer(t.cfg.SnapshotStallTimeout)
	defer timer.Stop()
	for receiving := true; receiving; {
		timer.Reset(t.cfg.SnapshotStallTimeout)
		select {
		case c := <-chunks:
			t.stats.snapshotChunksIn.Add(1)
			if err := r.add(c); err != nil {
				return reject(err)
			}
		case err := <-recvErr:
			if !errors.Is(err, io.EOF) {
				log.Info("snapshot transfer abandoned by the sender", zap.Error(err))
				return err
			}
			receiving = false
		case <-timer.C:
			log.Warn("snapshot transfer stalled", zap.Duration("timeout", t.cfg.SnapshotStallTimeout))
			return status.Errorf(codes.DeadlineExceeded, "quorumlock: no snapshot chunk within %v", t.cfg.SnapshotStallTimeout)
		case <-superseded:
			log.Info("snapshot transfer superseded by a newer one")
			return status.Error(codes.Aborted, "quorumlock: superseded by a newer snapshot from the same member")
		case <-t.ctx.Done():
			return errClosed
		}
	}
	m, err := r.finish()
	if err != nil {
		return reject(err)
	}
	if t.ctx.Err() != nil {
		return errClosed
	}
	p := t.peers[from]
	p.deliver.Lock()
	t.cfg.Handler(m)
	p.deliver.Unlock()
	t.stats.messagesReceived.Add(1)
	t.stats.snapshotsReceived.Add(1)
	log.Info("snapshot received", zap.Uint64("index", m.GetSnapshot().GetMetadata().GetIndex()),
		zap.Uint64("term", m.GetSnapshot().GetMetadata().GetTerm()), zap.Uint64("bytes", r.total))
	return stream.SendAndClose(&lockpb.SnapshotAck{Hello: &lockpb.Hello{ClusterId: t.cfg.ClusterID, From: t.cfg.ID, To: from}})
}

// acceptSnapshot makes the caller the current inbound snapshot transfer of
// member from and ends the previous one, which would only be outdated: this
// bounds the memory of inbound snapshots to one buffer per member. The
// returned channel is closed when a newer transfer supersedes the caller's.
func (t *Transport) acceptSnapshot(from uint64) chan struct{} {
	superseded := make(chan struct{})
	t.mu.Lock()
	defer t.mu.Unlock()
	if old := t.snapshotsIn[from]; old != nil {
		close(old)
	}
	t.snapshotsIn[from] = superseded
	return superseded
}

// releaseSnapshot ends the transfer of acceptSnapshot.
func (t *Transport) releaseSnapshot(from uint64, superseded chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.snapshotsIn[from] == superseded {
		delete(t.snapshotsIn, from)
	}
}

// reassembly collects the data of one inbound snapshot. Its errors are gRPC
// status errors for the sender.
type reassembly struct {
	m     *raftpb.Message // the MsgSnap, without its data until finish
	total uint64          // announced length of the data
	crc   uint32          // announced CRC-32C of the data
	sum   uint32          // CRC-32C of buf
	buf   []byte
}

// newReassembly checks the first chunk of a transfer from member from to
// member to: a MsgSnap between them without snapshot data, total at most
// max bytes, no data of its own. Only then does it allocate the buffer of
// total bytes.
func newReassembly(first *lockpb.SnapshotChunk, from, to, max uint64) (*reassembly, error) {
	m, err := decode(first.GetMessage(), from, to)
	switch {
	case err != nil:
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case m.GetType() != raftpb.MsgSnap:
		return nil, status.Errorf(codes.InvalidArgument, "quorumlock: snapshot stream carries %v, not MsgSnap", m.GetType())
	case len(m.GetSnapshot().GetData()) != 0:
		return nil, status.Error(codes.InvalidArgument, "quorumlock: snapshot header carries data")
	case first.GetOffset() != 0 || len(first.GetData()) != 0:
		return nil, status.Error(codes.InvalidArgument, "quorumlock: first snapshot chunk carries data")
	case first.GetTotal() > max:
		return nil, status.Errorf(codes.ResourceExhausted, "quorumlock: snapshot of %d bytes exceeds the limit of %d bytes",
			first.GetTotal(), max)
	}
	return &reassembly{m: m, total: first.GetTotal(), crc: first.GetCrc32C(), buf: make([]byte, 0, first.GetTotal())}, nil
}

// add appends the data of a chunk after the first; it must continue exactly
// where the previous one ended and stay within the announced total.
func (r *reassembly) add(c *lockpb.SnapshotChunk) error {
	d := c.GetData()
	switch {
	case c.GetHello() != nil || len(c.GetMessage()) != 0 || c.GetTotal() != 0 || c.GetCrc32C() != 0:
		return status.Error(codes.InvalidArgument, "quorumlock: snapshot header fields after the first chunk")
	case c.GetOffset() != uint64(len(r.buf)):
		return status.Errorf(codes.InvalidArgument, "quorumlock: snapshot chunk at offset %d, want %d", c.GetOffset(), len(r.buf))
	case uint64(len(d)) > r.total-uint64(len(r.buf)):
		return status.Errorf(codes.InvalidArgument, "quorumlock: snapshot chunk ends past the announced %d bytes", r.total)
	}
	r.buf = append(r.buf, d...)
	r.sum = crc32.Update(r.sum, castagnoli, d)
	return nil
}

// finish returns the MsgSnap with its data once all of it arrived and
// matches the announced CRC (codes.DataLoss if not).
func (r *reassembly) finish() (*raftpb.Message, error) {
	if uint64(len(r.buf)) != r.total {
		return nil, status.Errorf(codes.InvalidArgument, "quorumlock: snapshot ended after %d of %d bytes", len(r.buf), r.total)
	}
	if r.sum != r.crc {
		return nil, status.Errorf(codes.DataLoss, "quorumlock: snapshot data has CRC-32C %#08x, sender announced %#08x", r.sum, r.crc)
	}
	if r.m.Snapshot == nil {
		r.m.Snapshot = &raftpb.Snapshot{}
	}
	if r.total > 0 {
		r.m.Snapshot.Data = r.buf
	}
	return r.m, nil
}
