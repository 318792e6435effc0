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
type kaStream struct {
	cc *grpc.ClientConn

	mu      sync.Mutex
	stream  lockpb.Lock_KeepAliveClient
	cancel  context.CancelFunc
	next    uint64
	waiters map[uint64]chan *lockpb.KeepAliveResponse
	err     error
}

var errStreamBroken = errors.New("quorumlock: heartbeat stream broken")

func newKAStream(cc *grpc.ClientConn) *kaStream {
	return &kaStream{cc: cc, waiters: make(map[uint64]chan *lockpb.KeepAliveResponse)}
}

func (s *kaStream) broken() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err != nil
}

// send sends one batch and waits for its answer or ctx's end.
func (s *kaStream) send(ctx context.Context, ids []uint64) (*lockpb.KeepAliveResponse, error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.err
	}
	if s.stream == nil {
		sctx, cancel := context.WithCancel(context.Background())
		st, err := lockpb.NewLockClient(s.cc).KeepAlive(sctx)
		if err != nil {
			cancel()
			s.err = err
			s.mu.Unlock()
			return nil, err
		}
		s.stream, s.cancel = st, cancel
		go s.recv(st)
	}
	s.next++
	id := s.next
	c := make(chan *lockpb.KeepAliveResponse, 1)
	s.waiters[id] = c
	err := s.stream.Send(&lockpb.KeepAliveRequest{Batch: id, Sessions: ids})
	if err != nil {
		s.failLocked(err)
	}
	s.mu.Unlock()
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
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failLocked(errStreamBroken)
}
