package quorumlock

import (
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// scriptedStream is the client side of a ProposeStream whose replies the
// test hands to Recv one message at a time; polled gets a value at every
// Recv, so the test knows the previous message was handled.
type scriptedStream struct {
	lockpb.Lock_ProposeStreamClient
	in     chan *lockpb.ProposeReplies
	polled chan struct{}
}

func (f *scriptedStream) Recv() (*lockpb.ProposeReplies, error) {
	f.polled <- struct{}{}
	m, ok := <-f.in
	if !ok {
		return nil, errProposeClosed
	}
	return m, nil
}

// An abandoned open's id is forgotten once it is older than
// abandonedOpenTTL when the stream next gets an answer, not only when
// another open is abandoned; once none is kept, the map and the order are
// released. Age is simulated by back-dating the records (propStream reads
// the real clock: its bound is about answers in flight on the network).
// Before, the ids stayed until the next abandon (up to 65,536 per stream).
func TestReviewTAbandonedOpensPrunedWhenAnswersArrive(t *testing.T) {
	st := &scriptedStream{in: make(chan *lockpb.ProposeReplies), polled: make(chan struct{})}
	s := &propStream{stream: st, waiters: make(map[uint64]chan *lockpb.Response), kick: make(chan struct{}, 1)}
	go s.recvLoop(st)
	defer close(st.in)
	wait := func() {
		t.Helper()
		select {
		case <-st.polled:
		case <-time.After(10 * time.Second):
			t.Fatal("recvLoop did not read the next message")
		}
	}
	wait()
	s.mu.Lock()
	s.rememberAbandonedLocked(1, 0)
	s.rememberAbandonedLocked(2, 0)
	s.abandonedOrder[0].at = s.abandonedOrder[0].at.Add(-abandonedOpenTTL - time.Second)
	s.mu.Unlock()
	// An answer to some other call (id 9: nobody waits for it).
	st.in <- &lockpb.ProposeReplies{Replies: []*lockpb.ProposeReply{{Id: 9, Response: &lockpb.Response{}}}}
	wait()
	s.mu.Lock()
	_, old := s.abandonedOpens[1]
	_, fresh := s.abandonedOpens[2]
	kept := len(s.abandonedOrder)
	s.abandonedOrder[0].at = s.abandonedOrder[0].at.Add(-abandonedOpenTTL - time.Second)
	s.mu.Unlock()
	if old || !fresh || kept != 1 {
		t.Fatalf("after an answer: id 1 (past the TTL) kept %v, id 2 kept %v, %d in order", old, fresh, kept)
	}
	st.in <- &lockpb.ProposeReplies{Replies: []*lockpb.ProposeReply{{Id: 10, Response: &lockpb.Response{}}}}
	wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.abandonedOpens != nil || s.abandonedOrder != nil {
		t.Fatalf("all past the TTL: %d ids and %d records kept", len(s.abandonedOpens), len(s.abandonedOrder))
	}
}
