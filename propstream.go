package quorumlock

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// propStream multiplexes Propose calls to one replica over one
// ProposeStream: calls queued while the previous batch was being sent go
// out together in one message, and answers come back by id. It replaces a
// unary RPC per request, which costs a new HTTP/2 stream with its headers
// on both sides. Once the stream fails every waiting call gets the error
// and the propStream is discarded (broken); the caller makes a new one.
type propStream struct {
	mu      sync.Mutex
	stream  lockpb.Lock_ProposeStreamClient
	cancel  context.CancelFunc
	next    uint64
	waiters map[uint64]chan *lockpb.Response
	queue   []*lockpb.ProposeCall
	kick    chan struct{} // capacity 1: the queue has calls
	err     error
	// abandonedOpens holds the ids of session opens abandoned while
	// their answers may still come (sent, or in flight back), each with
	// its open ID: the cluster may have opened a session whose ID only
	// that answer tells, so it is closed when the answer comes (see
	// recvLoop), unless another attempt of the same NewSession call may
	// take it (opens decides for an open with an ID). Most never get an
	// answer (the replica saw the cancel first and expires the session
	// itself), so an id is forgotten after abandonedOpenTTL (when the
	// stream next gets an answer or abandons an open), and the oldest
	// first past maxAbandonedOpens (abandonedOrder lists them in
	// the order they were abandoned); a session whose answer comes later
	// expires after its TTL.
	abandonedOpens map[uint64]uint64
	abandonedOrder []abandonedOpen
	// opens are the NewSession calls of the stream's holder (nil: none).
	opens *openCalls
}

type abandonedOpen struct {
	id uint64
	at time.Time
}

// Bounds of propStream.abandonedOpens. An abandoned open's answer, if it
// comes, was in flight already.
const (
	abandonedOpenTTL  = 10 * time.Second
	maxAbandonedOpens = 1 << 16
)

var (
	errEmptyReply    = errors.New("quorumlock: reply without a response")
	errProposeClosed = errors.New("quorumlock: propose stream closed")
	errAborted       = errors.New("quorumlock: call abandoned (leader changed)")
)

// openPropStream opens a ProposeStream on cc, for the holder of opens (see
// propStream.abandonedOpens; nil: no NewSession calls). Opening waits while
// cc is connecting, for at most as long as ctx allows.
func openPropStream(ctx context.Context, cc *grpc.ClientConn, opens *openCalls) (*propStream, error) {
	sctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	st, err := lockpb.NewLockClient(cc).ProposeStream(sctx)
	if !stop() {
		cancel()
		return nil, ctx.Err()
	}
	if err != nil {
		cancel()
		return nil, err
	}
	s := &propStream{
		stream:  st,
		cancel:  cancel,
		waiters: make(map[uint64]chan *lockpb.Response),
		kick:    make(chan struct{}, 1),
		opens:   opens,
	}
	go s.recvLoop(st)
	go s.sendLoop(sctx, st)
	return s, nil
}

// cachedPropStream returns streams[key] (guarded by mu), or opens one over
// the connection conn returns (for at most as long as ctx allows, and until
// abort closes; nil: never) if there is none or it broke, for the holder
// of opens. Of two callers opening at once, the second closes its stream
// and uses the first's.
func cachedPropStream[K comparable](ctx context.Context, abort <-chan struct{}, mu *sync.Mutex, streams map[K]*propStream, key K, opens *openCalls, conn func() (*grpc.ClientConn, error)) (*propStream, error) {
	mu.Lock()
	s := streams[key]
	mu.Unlock()
	if s != nil && !s.broken() {
		return s, nil
	}
	if abort != nil {
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(chanCtx(abort), cancel)()
		ctx = actx
	}
	cc, err := conn()
	if err != nil {
		return nil, err
	}
	if s, err = openPropStream(ctx, cc, opens); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	if cur := streams[key]; cur != nil && !cur.broken() {
		s.close()
		return cur, nil
	}
	streams[key] = s
	return s, nil
}

func (s *propStream) broken() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err != nil
}

// call sends req and waits for its answer, the stream's failure (its
// error), ctx's end (ctx's error) or abort's closing (errAborted; nil:
// never); in the last two cases the server is told to stop waiting. It has
// the outcomes of a unary Propose: an error leaves the request's fate
// unknown, and the same request may be sent again.
//
// abort is a channel, not a context the caller derives with AfterFunc: a
// context.AfterFunc on a plain channel costs a goroutine per call.
func (s *propStream) call(ctx context.Context, abort <-chan struct{}, req *lockpb.Request) (*lockpb.Response, error) {
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return nil, err
	}
	s.next++
	id := s.next
	c := make(chan *lockpb.Response, 1)
	s.waiters[id] = c
	s.queue = append(s.queue, &lockpb.ProposeCall{Id: id, Request: req})
	s.mu.Unlock()
	s.wake()
	select {
	case resp, ok := <-c:
		if !ok {
			return nil, s.failure()
		}
		if resp == nil {
			return nil, errEmptyReply
		}
		return resp, nil
	case <-ctx.Done():
		s.abandon(id, req, c)
		return nil, ctx.Err()
	case <-abort:
		s.abandon(id, req, c)
		return nil, errAborted
	}
}

// abandon stops waiting for call id (of req, answered on c) and tells the
// server to stop too.
func (s *propStream) abandon(id uint64, req *lockpb.Request, c chan *lockpb.Response) {
	open := req.GetOp() == lockpb.Op_OP_OPEN_SESSION
	s.mu.Lock()
	if _, waiting := s.waiters[id]; waiting && s.err == nil {
		delete(s.waiters, id)
		s.queue = append(s.queue, &lockpb.ProposeCall{Id: id, Cancel: true})
		if open {
			s.rememberAbandonedLocked(id, req.GetOpenId())
		}
	} else if open && s.err == nil {
		// Answered as the call gave up: the answer is in c, unread.
		select {
		case resp, ok := <-c:
			if ok {
				s.lateAnswerLocked(req.GetOpenId(), resp)
			}
		default:
		}
	}
	s.mu.Unlock()
	s.wake()
}

// rememberAbandonedLocked records the abandoned open id, of open ID
// openID (see abandonedOpens), forgetting those past the bounds. s.mu is
// held.
func (s *propStream) rememberAbandonedLocked(id, openID uint64) {
	now := time.Now()
	s.pruneAbandonedLocked(now, 1)
	s.abandonedOrder = append(s.abandonedOrder, abandonedOpen{id, now})
	if s.abandonedOpens == nil {
		s.abandonedOpens = make(map[uint64]uint64)
	}
	s.abandonedOpens[id] = openID
}

// pruneAbandonedLocked forgets the abandoned opens older than
// abandonedOpenTTL at now, and the oldest while more than
// maxAbandonedOpens-room are kept. Once none is kept, the map and the
// order go too: a Go map does not shrink, and a burst of abandons would
// otherwise hold its memory for the stream's life. s.mu is held.
func (s *propStream) pruneAbandonedLocked(now time.Time, room int) {
	drop := 0
	for drop < len(s.abandonedOrder) && (len(s.abandonedOrder)-drop > maxAbandonedOpens-room || now.Sub(s.abandonedOrder[drop].at) > abandonedOpenTTL) {
		delete(s.abandonedOpens, s.abandonedOrder[drop].id)
		drop++
	}
	s.abandonedOrder = s.abandonedOrder[drop:]
	if len(s.abandonedOrder) == 0 {
		s.abandonedOrder, s.abandonedOpens = nil, nil
	}
}

// closeAbandonedLocked closes the session opened by the abandoned call id,
// if it was an open (see abandonedOpens) answered with a session that no
// other attempt of its NewSession call may take. s.mu is held.
func (s *propStream) closeAbandonedLocked(id uint64, resp *lockpb.Response) {
	openID, ok := s.abandonedOpens[id]
	if !ok {
		return
	}
	delete(s.abandonedOpens, id)
	s.lateAnswerLocked(openID, resp)
}

// lateAnswerLocked closes the session that resp, the answer to an
// abandoned open of open ID openID, opened: at once without an open ID,
// else when s.opens says no other attempt of the call may take it. s.mu
// is held.
func (s *propStream) lateAnswerLocked(openID uint64, resp *lockpb.Response) {
	if openID == 0 || s.opens.lateAnswer(openID, s, resp) {
		s.closeOpenedLocked(resp)
	}
}

// closeOpened is closeOpenedLocked for a caller without s.mu; nothing
// once the stream failed.
func (s *propStream) closeOpened(resp *lockpb.Response) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.closeOpenedLocked(resp)
	}
}

// closeOpenedLocked closes the session that resp, the answer to an open
// nobody reads, opened, if any. s.mu is held.
func (s *propStream) closeOpenedLocked(resp *lockpb.Response) {
	if resp.GetCode() != lockpb.Code_CODE_OK || resp.GetSession() == 0 {
		return
	}
	// Nobody waits for the answer: the session's first request, closing
	// it, frees its place under MaxSessions at once.
	s.next++
	s.queue = append(s.queue, &lockpb.ProposeCall{Id: s.next, Request: &lockpb.Request{
		Op: lockpb.Op_OP_CLOSE_SESSION, Session: resp.GetSession(), Seq: 1, Done: 1, Listed: true,
	}})
	s.wake()
}

func (s *propStream) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *propStream) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// sendLoop sends the queued calls, as many per message as fit.
//
// Woken by the first call, it yields its processor once before taking the
// queue: callers are woken together (by one message of answers, or one
// apply on this replica), and without the yield each one's call went out
// alone, about 1.05 calls per message in uncontended_256, each paying
// gRPC's framing, a write and a read. With it: 8-9 calls per message and
// 8-16% less process CPU per cycle (the benchmark's A/B, docs/architecture.md).
// With a processor idle the yield returns at once.
func (s *propStream) sendLoop(ctx context.Context, st lockpb.Lock_ProposeStreamClient) {
	for {
		select {
		case <-s.kick:
		case <-ctx.Done():
			return
		}
		runtime.Gosched()
		s.mu.Lock()
		batch := s.queue
		s.queue = nil
		s.mu.Unlock()
		for len(batch) > 0 {
			n := lockpb.BatchLen(batch)
			if err := st.Send(&lockpb.ProposeCalls{Calls: batch[:n]}); err != nil {
				s.mu.Lock()
				s.failLocked(err)
				s.mu.Unlock()
				return
			}
			batch = batch[n:]
		}
	}
}

func (s *propStream) recvLoop(st lockpb.Lock_ProposeStreamClient) {
	for {
		in, err := st.Recv()
		s.mu.Lock()
		if err != nil {
			s.failLocked(err)
			s.mu.Unlock()
			return
		}
		for _, r := range in.GetReplies() {
			if c, ok := s.waiters[r.GetId()]; ok {
				delete(s.waiters, r.GetId())
				c <- r.GetResponse()
			} else if len(s.abandonedOpens) > 0 {
				s.closeAbandonedLocked(r.GetId(), r.GetResponse())
			}
		}
		if len(s.abandonedOrder) > 0 {
			// After the answers: one of them may be an old open's.
			s.pruneAbandonedLocked(time.Now(), 0)
		}
		s.mu.Unlock()
	}
}

func (s *propStream) failLocked(err error) {
	if s.err == nil {
		s.err = err
	}
	for id, c := range s.waiters {
		close(c)
		delete(s.waiters, id)
	}
	s.queue = nil
	if s.cancel != nil {
		s.cancel()
	}
}

func (s *propStream) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failLocked(errProposeClosed)
}
