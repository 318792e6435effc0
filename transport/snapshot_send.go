package transport

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// snapshotChunkBytes is the snapshot data carried by one chunk: well under
// gRPC's default 4 MiB receive limit, and large enough that the per-message
// cost does not matter.
const snapshotChunkBytes = 1 << 20

// castagnoli is the CRC-32C table of the snapshot checksum.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// offerSnapshot makes m the next snapshot to transfer to the peer. A
// snapshot still waiting for its transfer is replaced and counted as
// dropped; the one in transfer, if any, goes on. It never blocks.
func (p *peer) offerSnapshot(m *raftpb.Message) {
	p.snapMu.Lock()
	old := p.snapPending
	p.snapPending = m
	p.snapMu.Unlock()
	if old != nil {
		p.t.stats.dropped.Add(1)
		p.log.Debug("snapshot superseded before its transfer started",
			zap.Uint64("index", old.GetSnapshot().GetMetadata().GetIndex()),
			zap.Uint64("new_index", m.GetSnapshot().GetMetadata().GetIndex()))
	}
	select {
	case p.snapKick <- struct{}{}:
	default:
	}
}

// takeSnapshot empties the snapshot slot and returns what it held.
func (p *peer) takeSnapshot() *raftpb.Message {
	p.snapMu.Lock()
	defer p.snapMu.Unlock()
	m := p.snapPending
	p.snapPending = nil
	return m
}

// runSnapshots transfers the peer's snapshots, one at a time, and reports
// each outcome until the transport closes. It runs on its own goroutine,
// started by New.
func (p *peer) runSnapshots() {
	defer p.t.wg.Done()
	ctx := p.t.ctx
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.snapKick:
		}
		m := p.takeSnapshot()
		if m == nil {
			continue
		}
		start := time.Now()
		err := p.sendSnapshot(ctx, m)
		if ctx.Err() != nil {
			return // closing: not reported
		}
		meta := m.GetSnapshot().GetMetadata()
		fields := []zap.Field{
			zap.Uint64("index", meta.GetIndex()),
			zap.Uint64("term", meta.GetTerm()),
			zap.Int("bytes", len(m.GetSnapshot().GetData())),
			zap.Duration("took", time.Since(start)),
		}
		if err != nil {
			p.t.stats.dropped.Add(1)
			p.t.stats.snapshotsFailed.Add(1)
			p.t.rep.snapshotFailed(p.id)
			level := zap.WarnLevel
			if errors.Is(err, errRejected) {
				level = zap.ErrorLevel
			}
			p.log.Log(level, "snapshot transfer failed", append(fields, zap.Error(err))...)
			continue
		}
		p.t.stats.messagesSent.Add(1)
		p.t.stats.snapshotsSent.Add(1)
		p.t.rep.snapshotSent(p.id)
		p.log.Info("snapshot sent", fields...)
	}
}

// sendSnapshot transfers m on a Peer.Snapshot stream of its own connection
// (see "Snapshots" in doc.go) and returns nil once the receiver acknowledged
// it. A stall of more than SnapshotStallTimeout, and the end of ctx, cancel
// the transfer.
func (p *peer) sendSnapshot(ctx context.Context, m *raftpb.Message) (err error) {
	cfg := &p.t.cfg
	data := m.GetSnapshot().GetData()
	header, err := proto.Marshal(withoutSnapshotData(m))
	if err != nil {
		return fmt.Errorf("marshal: %w", err)
	}
	first := &lockpb.SnapshotChunk{
		Hello:   &lockpb.Hello{ClusterId: cfg.ClusterID, From: cfg.ID, To: p.id},
		Message: header,
		Total:   uint64(len(data)),
		Crc32C:  crc32.Checksum(data, castagnoli),
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stall := cfg.SnapshotStallTimeout
	var stalled atomic.Bool
	watchdog := time.AfterFunc(stall, func() {
		stalled.Store(true)
		cancel()
	})
	defer func() {
		watchdog.Stop()
		if err != nil && stalled.Load() {
			err = fmt.Errorf("no progress within %v: %w", stall, err)
		}
	}()

	cc, err := p.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	stream, err := lockpb.NewPeerClient(cc).Snapshot(ctx)
	if err != nil {
		return p.rejection(err)
	}
	// Send returns once gRPC has taken the chunk, which its flow control
	// delays while the receiver is behind: that is the backpressure.
	send := func(c *lockpb.SnapshotChunk) error {
		if err := stream.Send(c); err != nil {
			if errors.Is(err, io.EOF) {
				// The receiver ended the stream; CloseAndRecv returns why.
				if _, err = stream.CloseAndRecv(); err == nil {
					err = errors.New("receiver ended the transfer early")
				}
			}
			return p.rejection(err)
		}
		p.t.stats.snapshotChunksSent.Add(1)
		watchdog.Reset(stall)
		return nil
	}
	if err := send(first); err != nil {
		return err
	}
	for off := 0; off < len(data); off += snapshotChunkBytes {
		end := min(off+snapshotChunkBytes, len(data))
		if err := send(&lockpb.SnapshotChunk{Offset: uint64(off), Data: data[off:end:end]}); err != nil {
			return err
		}
	}
	ack, err := stream.CloseAndRecv()
	if err != nil {
		return p.rejection(err)
	}
	if h := ack.GetHello(); h.GetClusterId() != cfg.ClusterID || h.GetFrom() != p.id || h.GetTo() != cfg.ID {
		p.t.stats.outboundRejected.Add(1)
		return fmt.Errorf("%w: snapshot acknowledged by cluster %d, member %d, to %d (want cluster %d, member %d, to %d)",
			errRejected, h.GetClusterId(), h.GetFrom(), h.GetTo(), cfg.ClusterID, p.id, cfg.ID)
	}
	return nil
}

// rejection returns err, wrapping errRejected and counted in
// Stats.OutboundRejected if it is the other end's refusal of the handshake.
func (p *peer) rejection(err error) error {
	if c := status.Code(err); c == codes.PermissionDenied || c == codes.FailedPrecondition {
		p.t.stats.outboundRejected.Add(1)
		return fmt.Errorf("%w: %v", errRejected, err)
	}
	return err
}

// withoutSnapshotData returns a message equal to m except that its snapshot
// has no data. It shares m's other fields, and it leaves m alone: raft's
// storage may hold the same snapshot.
func withoutSnapshotData(m *raftpb.Message) *raftpb.Message {
	h := &raftpb.Message{}
	hr, mr := h.ProtoReflect(), m.ProtoReflect()
	mr.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		hr.Set(fd, v)
		return true
	})
	hr.SetUnknown(mr.GetUnknown())
	h.Snapshot = &raftpb.Snapshot{Metadata: m.GetSnapshot().GetMetadata()}
	return h
}
