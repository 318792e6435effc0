package quorumlock

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// kaStream multiplexes heartbeat batches over one KeepAlive stream to one
// replica: many sessions, one stream, one request per batch.
//
// Nothing blocks under mu: a Send waits for the stream's flow control, and
// on a link that black-holes traffic that lasts until gRPC's keepalive
// closes the connection (10-20 s), so sends are serialized by sending
// instead, which a batch waits for only as long as its ctx allows. A batch
// whose ctx ends while its Send is blocked breaks the stream (the next
// batch opens a new one), which also frees the batches behind it.
type kaStream struct {
	cc      *grpc.ClientConn
	sending chan struct{} // capacity 1: held while opening the stream or sending on it

	mu      sync.Mutex
	stream  lockpb.Lock_KeepAliveClient
	cancel  context.CancelFunc
	next    uint64
	waiters map[uint64]chan *lockpb.KeepAliveResponse
	err     error
}

var (
	errStreamBroken = errors.New("quorumlock: heartbeat stream broken")
	errSendStalled  = errors.New("quorumlock: heartbeat stream stalled")
)

func newKAStream(cc *grpc.ClientConn) *kaStream {
	return &kaStream{cc: cc, sending: make(chan struct{}, 1), waiters: make(map[uint64]chan *lockpb.KeepAliveResponse)}
}

func (s *kaStream) broken() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err != nil
}

// send sends one batch and waits for its answer or ctx's end.
func (s *kaStream) send(ctx context.Context, ids []uint64) (*lockpb.KeepAliveResponse, error) {
	select {
	case s.sending <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	st, id, c, err := s.register(ctx)
	if err == nil {
		// A Send still blocked when ctx ends is given up with the stream.
		stop := context.AfterFunc(ctx, func() { s.fail(errSendStalled) })
		err = st.Send(&lockpb.KeepAliveRequest{Batch: id, Sessions: ids})
		stop()
		if err != nil {
			s.fail(err)
		}
	}
	<-s.sending
	if err != nil {
		return nil, err
	}
	select {
	case resp, ok := <-c:
		if !ok {
			return nil, errStreamBroken
		}
		return resp, nil
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.waiters, id)
		s.mu.Unlock()
		return nil, ctx.Err()
	}
}

// register opens the stream if it is not open yet (for at most as long as
// ctx allows) and registers a waiter for a new batch number, unless ctx
// has ended. The caller holds sending.
func (s *kaStream) register(ctx context.Context) (lockpb.Lock_KeepAliveClient, uint64, chan *lockpb.KeepAliveResponse, error) {
	s.mu.Lock()
	err, st := s.err, s.stream
	s.mu.Unlock()
	if err != nil {
		return nil, 0, nil, err
	}
	if st == nil {
		// Opening waits while the connection is being made.
		sctx, cancel := context.WithCancel(context.Background())
		stop := context.AfterFunc(ctx, cancel)
		st, err = lockpb.NewLockClient(s.cc).KeepAlive(sctx)
		if !stop() {
			cancel()
			return nil, 0, nil, ctx.Err()
		}
		if err != nil {
			cancel()
			s.fail(err)
			return nil, 0, nil, err
		}
		s.mu.Lock()
		if s.err != nil { // closed meanwhile
			err = s.err
			s.mu.Unlock()
			cancel()
			return nil, 0, nil, err
		}
		s.stream, s.cancel = st, cancel
		s.mu.Unlock()
		go s.recv(st)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, 0, nil, s.err
	}
	// A batch whose ctx ended while it waited for the slot or the stream
	// sends nothing: its Send would be taken for a stalled one and break
	// the stream under the other batches.
	if err := ctx.Err(); err != nil {
		return nil, 0, nil, err
	}
	s.next++
	c := make(chan *lockpb.KeepAliveResponse, 1)
	s.waiters[s.next] = c
	return st, s.next, c, nil
}

func (s *kaStream) recv(st lockpb.Lock_KeepAliveClient) {
	for {
		resp, err := st.Recv()
		s.mu.Lock()
		if err != nil {
			s.failLocked(err)
			s.mu.Unlock()
			return
		}
		if c, ok := s.waiters[resp.GetBatch()]; ok {
			delete(s.waiters, resp.GetBatch())
			c <- resp
		}
		s.mu.Unlock()
	}
}

func (s *kaStream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failLocked(err)
}

// failLocked breaks the stream: every waiting batch gets errStreamBroken,
// and a Send in progress returns.
func (s *kaStream) failLocked(err error) {
	if s.err == nil {
		s.err = err
	}
	for id, c := range s.waiters {
		close(c)
		delete(s.waiters, id)
	}
	if s.cancel != nil {
		s.cancel()
	}
}

func (s *kaStream) close() {
	s.fail(errStreamBroken)
}
