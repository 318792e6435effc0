package service

import (
	"context"
	"errors"
	"io"
	"runtime"
	"sync"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// ProposeStream is the stream form of Propose: each call runs as Propose
// does, under a context that ends when the client cancels the call or the
// stream ends, and is answered by id; the answers that are ready together go
// back in one message. One stream replaces one unary RPC (a new HTTP/2
// stream, headers and all) per request.
//
// A call whose id is already in progress on the stream is answered
// CODE_INVALID at once. When the client half-closes the stream, the calls
// in progress are still answered, then the stream ends; when the stream
// breaks, they are cancelled. The handler returns only after its sender has
// stopped (gRPC forbids Send after the handler returns).
func (s *Service) ProposeStream(stream lockpb.Lock_ProposeStreamServer) error {
	ctx, cancelAll := context.WithCancel(stream.Context())
	defer cancelAll()
	var (
		mu       sync.Mutex
		calls    = make(map[uint64]context.CancelFunc)
		replies  []*lockpb.ProposeReply
		kick     = make(chan struct{}, 1)
		draining = make(chan struct{}) // closed: send what is queued, then stop
		sendErr  = make(chan error, 1)
		sent     = make(chan struct{}) // closed when the sender stops
		inflight sync.WaitGroup
	)
	reply := func(r *lockpb.ProposeReply) {
		mu.Lock()
		replies = append(replies, r)
		mu.Unlock()
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	go func() {
		defer close(sent)
		for {
			stop := false
			select {
			case <-kick:
			case <-draining:
				stop = true
			case <-ctx.Done():
				return
			}
			// The calls answered by one apply finish together: yield once
			// so that they all queue their replies and go out in one
			// message, not one each (as the client's sendLoop does).
			runtime.Gosched()
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
			if stop {
				return
			}
		}
	}()
	finish := func(err error) error {
		if err == nil {
			inflight.Wait() // every call answered or cancelled by its client
		} else {
			cancelAll()
			inflight.Wait()
		}
		close(draining)
		<-sent
		select {
		case serr := <-sendErr:
			if err == nil {
				err = serr
			}
		default:
		}
		return err
	}
	for {
		in, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return finish(nil)
		}
		if err != nil {
			return finish(err)
		}
		for _, c := range in.GetCalls() {
			id := c.GetId()
			mu.Lock()
			cancel, busy := calls[id]
			mu.Unlock()
			if c.GetCancel() {
				if busy {
					cancel()
				}
				continue
			}
			if busy {
				reply(&lockpb.ProposeReply{Id: id, Response: &lockpb.Response{Code: lockpb.Code_CODE_INVALID, Message: "call id already in progress on this stream"}})
				continue
			}
			cctx, cancel := context.WithCancel(ctx)
			mu.Lock()
			calls[id] = cancel
			mu.Unlock()
			inflight.Add(1)
			go func(req *lockpb.Request) {
				defer inflight.Done()
				resp, err := s.Propose(cctx, req)
				cancelled := cctx.Err() != nil
				mu.Lock()
				delete(calls, id)
				mu.Unlock()
				cancel()
				// Propose fails only with its context's error: the client
				// cancelled (no answer wanted) or the stream is ending.
				if err == nil && !cancelled {
					reply(&lockpb.ProposeReply{Id: id, Response: resp})
				} else if err == nil && req.GetOp() == lockpb.Op_OP_OPEN_SESSION && resp.GetCode() == lockpb.Code_CODE_OK && req.GetOpenId() == 0 {
					// Opened as the client gave up: nobody learns the
					// session's ID. Not with an open ID: another attempt
					// of the open may have got the same session, or get
					// it (see Service.abandonOpen).
					s.expireUnused(resp.GetSession())
				}
			}(c.GetRequest())
		}
		select {
		case err := <-sendErr:
			return finish(err)
		default:
		}
	}
}
