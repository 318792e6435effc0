package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// peerService is the server side of the Peer service, registered by
// Transport.Register.
type peerService struct {
	lockpb.UnimplementedPeerServer
	t *Transport
}

// Stream serves one inbound peer stream on the gRPC handler goroutine.
func (s *peerService) Stream(stream lockpb.Peer_StreamServer) error {
	return s.t.serve(stream)
}

// Snapshot serves one inbound snapshot transfer on the gRPC handler
// goroutine.
func (s *peerService) Snapshot(stream lockpb.Peer_SnapshotServer) error {
	return s.t.serveSnapshot(stream)
}

// inbound is one accepted inbound stream of a peer.
type inbound struct {
	superseded chan struct{} // closed when a newer stream of the same peer is accepted
	done       chan struct{} // closed when this stream will deliver nothing more
}

var errClosed = status.Error(codes.Unavailable, "quorumlock: transport closed")

// serve runs one inbound stream: the handshake (step 2 and 3 in doc.go), then
// delivery to Handler in order, until the stream ends, fails, is superseded
// or t is closed. A reader goroutine receives the frames so that this
// goroutine can also watch for Close; gRPC ends the reader's Recv once serve
// returns.
func (t *Transport) serve(stream lockpb.Peer_StreamServer) error {
	if !t.track() {
		return errClosed
	}
	defer t.wg.Done()

	stop := make(chan struct{})
	defer close(stop)
	frames, recvErr := recvLoop(t, stream.Recv, stop)
	log := t.remoteLogger(stream.Context())

	first, err := awaitHello(stream.Context(), t, frames, recvErr, log, "peer stream")
	if err != nil {
		return err
	}
	from := first.GetHello().GetFrom()
	log = log.With(zap.Uint64("peer", from))
	if n := len(first.GetMessages()); n > 0 {
		log.Debug("ignoring messages sent with the hello", zap.Int("messages", n))
	}

	in, err := t.accept(from)
	defer t.release(from, in)
	if err != nil {
		return err
	}
	answer := &lockpb.PeerFrame{Hello: &lockpb.Hello{ClusterId: t.cfg.ClusterID, From: t.cfg.ID, To: from}}
	if err := stream.Send(answer); err != nil {
		return err
	}
	log.Debug("accepted peer stream")

	for {
		select {
		case f := <-frames:
			if f.GetHello() != nil {
				log.Warn("closing peer stream: hello after the handshake")
				return status.Error(codes.InvalidArgument, "quorumlock: hello after the handshake")
			}
			if err := t.deliverFrame(from, f.GetMessages()); err != nil {
				log.Warn("closing peer stream: bad message", zap.Error(err))
				return status.Error(codes.InvalidArgument, err.Error())
			}
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-in.superseded:
			log.Debug("peer stream superseded by a newer one")
			return status.Error(codes.Aborted, "quorumlock: superseded by a newer stream from the same member")
		case <-t.ctx.Done():
			return errClosed
		}
	}
}

// recvLoop calls recv on a new goroutine, counted in t.wg, and hands each
// message it returns over on the first channel until recv fails (the error
// goes to the second channel) or stop is closed. The caller must hold a
// t.wg count, so that the Add cannot race with Close's Wait, and must return
// from its gRPC handler after closing stop: gRPC then ends a blocked recv.
// awaitHello waits for the first frame of an inbound stream and checks its
// Hello (step 2 in doc.go): a stream that sends none within
// handshakeTimeout, or a stranger's, or one Config.Authorize refuses, is
// rejected and counted.
func awaitHello[M interface{ GetHello() *lockpb.Hello }](ctx context.Context, t *Transport, frames <-chan M, recvErr <-chan error, log *zap.Logger, kind string) (M, error) {
	var first M
	timer := time.NewTimer(handshakeTimeout)
	defer timer.Stop()
	select {
	case first = <-frames:
	case err := <-recvErr:
		return first, err
	case <-timer.C:
		t.stats.inboundRejected.Add(1)
		log.Warn("rejected "+kind+": no hello", zap.Duration("timeout", handshakeTimeout))
		return first, status.Errorf(codes.DeadlineExceeded, "quorumlock: no hello within %v", handshakeTimeout)
	case <-t.ctx.Done():
		return first, errClosed
	}
	h := first.GetHello()
	err := t.checkHello(h)
	if err == nil && t.cfg.Authorize != nil {
		if aerr := t.cfg.Authorize(ctx, h.GetFrom()); aerr != nil {
			err = status.Errorf(codes.PermissionDenied, "quorumlock: not authorized as member %d: %v", h.GetFrom(), aerr)
		}
	}
	if err != nil {
		t.stats.inboundRejected.Add(1)
		log.Warn("rejected "+kind, zap.Uint64("cluster", h.GetClusterId()),
			zap.Uint64("from", h.GetFrom()), zap.Uint64("to", h.GetTo()), zap.Error(err))
		return first, err
	}
	return first, nil
}

func recvLoop[M any](t *Transport, recv func() (M, error), stop <-chan struct{}) (<-chan M, <-chan error) {
	out := make(chan M)
	errc := make(chan error, 1)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		for {
			m, err := recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case out <- m:
			case <-stop:
				return
			}
		}
	}()
	return out, errc
}

// remoteLogger returns t's logger annotated with the remote address of the
// inbound stream of ctx.
func (t *Transport) remoteLogger(ctx context.Context) *zap.Logger {
	if p, ok := grpcpeer.FromContext(ctx); ok {
		return t.log.With(zap.Stringer("remote", p.Addr))
	}
	return t.log
}

// deliverFrame decodes the messages of a frame of the stream from member
// from and hands them to Handler in order. It stops at the first message
// that does not decode and returns its error.
func (t *Transport) deliverFrame(from uint64, msgs [][]byte) error {
	p := t.peers[from]
	p.deliver.Lock()
	defer p.deliver.Unlock()
	for _, b := range msgs {
		m, err := decode(b, from, t.cfg.ID)
		if err != nil {
			return err
		}
		t.cfg.Handler(m)
		t.stats.messagesReceived.Add(1)
	}
	return nil
}

// checkHello returns the status error that rejects h, or nil if h opens a
// stream from another member of this cluster to this replica.
func (t *Transport) checkHello(h *lockpb.Hello) error {
	switch {
	case h == nil:
		return status.Error(codes.InvalidArgument, "quorumlock: first frame has no hello")
	case h.GetClusterId() != t.cfg.ClusterID:
		return status.Errorf(codes.FailedPrecondition, "quorumlock: cluster ID %d, this replica is in cluster %d",
			h.GetClusterId(), t.cfg.ClusterID)
	case h.GetTo() != t.cfg.ID:
		return status.Errorf(codes.FailedPrecondition, "quorumlock: stream for member %d reached member %d",
			h.GetTo(), t.cfg.ID)
	case h.GetFrom() == t.cfg.ID:
		return status.Errorf(codes.PermissionDenied, "quorumlock: stream claims to come from this replica (%d)", t.cfg.ID)
	}
	if _, ok := t.cfg.Peers[h.GetFrom()]; !ok {
		return status.Errorf(codes.PermissionDenied, "quorumlock: member %d is not in the cluster", h.GetFrom())
	}
	return nil
}

// accept makes in the current stream of member from, closes the previous
// one, and waits until the previous one delivers nothing more, so that the
// member's messages reach Handler in order. The caller must call release
// even when accept returns an error (t closed meanwhile).
func (t *Transport) accept(from uint64) (*inbound, error) {
	in := &inbound{superseded: make(chan struct{}), done: make(chan struct{})}
	t.mu.Lock()
	old := t.inbound[from]
	t.inbound[from] = in
	t.mu.Unlock()
	if old == nil {
		return in, nil
	}
	close(old.superseded)
	select {
	case <-old.done:
		return in, nil
	case <-t.ctx.Done():
		return in, errClosed
	}
}

// release ends in as the stream of member from.
func (t *Transport) release(from uint64, in *inbound) {
	t.mu.Lock()
	if t.inbound[from] == in {
		delete(t.inbound, from)
	}
	t.mu.Unlock()
	close(in.done)
}

// decode unmarshals one message of the stream from member from to member to
// and checks that the message says the same.
func decode(b []byte, from, to uint64) (*raftpb.Message, error) {
	m := &raftpb.Message{}
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("quorumlock: unmarshal raft message: %w", err)
	}
	if m.GetFrom() != from || m.GetTo() != to {
		return nil, fmt.Errorf("quorumlock: message from %d to %d on the stream from %d to %d",
			m.GetFrom(), m.GetTo(), from, to)
	}
	return m, nil
}
