package service

import (
	"context"
	"sync"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// ProposeStream is the stream form of Propose: each call runs as Propose
// does, under a context that ends when the client cancels the call or the
// stream ends, and is answered by id; the answers that are ready together go
// back in one message. One stream replaces one unary RPC (a new HTTP/2
// stream, headers and all) per request.
func (s *Service) ProposeStream(stream lockpb.Lock_ProposeStreamServer) error {
	ctx, cancelAll := context.WithCancel(stream.Context())
	defer cancelAll()
	var (
		mu      sync.Mutex
		calls   = make(map[uint64]context.CancelFunc)
		replies []*lockpb.ProposeReply
		kick    = make(chan struct{}, 1)
		sendErr = make(chan error, 1)
	)
	go func() {
		for {
			select {
			case <-kick:
			case <-ctx.Done():
				return
			}
			mu.Lock()
			batch := replies
			replies = nil
			mu.Unlock()
			for len(batch) > 0 {
				n := lockpb.BatchLen(batch)
				if err := stream.Send(&lockpb.ProposeReplies{Replies: batch[:n]}); err != nil {
					sendErr <- err
					cancelAll()
					return
				}
				batch = batch[n:]
			}
		}
	}()
	for {
		in, err := stream.Recv()
		if err != nil {
			return err
		}
		for _, c := range in.GetCalls() {
			id := c.GetId()
			if c.GetCancel() {
				mu.Lock()
				if cancel := calls[id]; cancel != nil {
					cancel()
					delete(calls, id)
				}
				mu.Unlock()
				continue
			}
			cctx, cancel := context.WithCancel(ctx)
			mu.Lock()
			calls[id] = cancel
			mu.Unlock()
			go func(req *lockpb.Request) {
				resp, err := s.Propose(cctx, req)
				mu.Lock()
				_, live := calls[id]
				delete(calls, id)
				if live && err == nil {
					replies = append(replies, &lockpb.ProposeReply{Id: id, Response: resp})
				}
				mu.Unlock()
				cancel()
				// Propose fails only with its context's error: the client
				// cancelled (no answer wanted) or the stream is ending.
				if live && err == nil {
					select {
					case kick <- struct{}{}:
					default:
					}
				}
			}(c.GetRequest())
		}
		select {
		case err := <-sendErr:
			return err
		default:
		}
	}
}
