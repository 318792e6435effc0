package quorumlock

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// blackHole dials TCP and, while closed, stalls every write of its
// connections (a link that black-holes traffic, without a reset) until it
// opens again or the connection closes.
type blackHole struct {
	mu   sync.Mutex
	open chan struct{} // closed while writes pass
}

func newBlackHole() *blackHole {
	b := &blackHole{open: make(chan struct{})}
	close(b.open)
	return b
}

func (b *blackHole) cut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.open = make(chan struct{})
}

func (b *blackHole) heal() {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.open:
	default:
		close(b.open)
	}
}

func (b *blackHole) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &holeConn{Conn: c, b: b, done: make(chan struct{})}, nil
}

type holeConn struct {
	net.Conn
	b    *blackHole
	once sync.Once
	done chan struct{}
}

func (c *holeConn) Write(p []byte) (int, error) {
	c.b.mu.Lock()
	open := c.b.open
	c.b.mu.Unlock()
	select {
	case <-open:
	case <-c.done:
		return 0, net.ErrClosed
	}
	return c.Conn.Write(p)
}

func (c *holeConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return c.Conn.Close()
}

// A client with many sessions whose link to the leader black-holes fills
// the heartbeat stream's flow-control window: a batch's Send then blocks
// until the connection dies (gRPC keepalive: 10-20 s). That must hold up
// neither the client's other calls nor other heartbeat batches past their
// contexts (invariant 12): the heartbeat stream used to be sent on under
// its mutex, which Client.keepAlive took under the client's own mutex, so
// every call of the client waited for the dead connection. (Close is not
// checked: gRPC's ClientConn.Close gives a black-holed connection 5 s to
// take its GOAWAY.)
func TestBlackHoledHeartbeatStreamBlocksNothing(t *testing.T) {
	_, addr := startOne(t)
	hole := newBlackHole()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, []string{addr}, WithDialer(hole.dial), WithSessionTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer hole.heal() // first: a failed test's Close must not wait for the dead link
	if _, err := c.NewSession(ctx); err != nil {
		t.Fatal(err)
	}

	hole.cut()
	// Batches of 10,000 sessions (the batch limit) with large IDs: about
	// 60 KB each, so a few exhaust the stream's 64 KB write quota.
	ids := make([]uint64, maxBatch)
	for i := range ids {
		ids[i] = 1<<40 + uint64(i)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			c.keepAlive(bctx, ids)
		}()
	}

	// Each of these has 300 ms; none may wait for the dead connection.
	calls := map[string]func(context.Context) error{
		"heartbeat batches": func(context.Context) error { wg.Wait(); return nil },
		"keepAlive": func(ctx context.Context) error {
			_, _, err := c.keepAlive(ctx, []uint64{1})
			return err
		},
		"NewSession": func(ctx context.Context) error { _, err := c.NewSession(ctx); return err },
		"Holder":     func(ctx context.Context) error { _, err := c.Holder(ctx, "x"); return err },
	}
	for name, call := range calls {
		done := make(chan error, 1)
		go func() {
			cctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			done <- call(cctx)
		}()
		select {
		case err := <-done:
			t.Logf("%s: %v", name, err)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s blocked past its context behind a black-holed heartbeat stream", name)
		}
	}
}

// A batch whose ctx has already ended when it gets the send slot (it
// waited behind a slow Send for all of its time) sends nothing and leaves
// the stream alone: it used to register, and its ctx's AfterFunc, meant
// for a Send blocked by flow control, broke the healthy stream at once,
// failing every other batch waiting on it.
func TestEndedBatchLeavesStreamAlone(t *testing.T) {
	_, addr := startOne(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, []string{addr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sess, err := c.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := c.conn(addr)
	if err != nil {
		t.Fatal(err)
	}
	s := newKAStream(cc)
	defer s.close()
	if _, err := s.send(ctx, []uint64{sess.ID()}); err != nil {
		t.Fatal(err)
	}
	ended, end := context.WithCancel(context.Background())
	end()
	// send picks between a free slot and the ended ctx at random: enough
	// rounds take the slot.
	for range 32 {
		if _, err := s.send(ended, []uint64{sess.ID()}); err == nil {
			t.Fatal("send with an ended ctx succeeded")
		}
		if s.broken() {
			t.Fatal("a batch whose ctx had ended broke the stream")
		}
	}
	resp, err := s.send(ctx, []uint64{sess.ID()})
	if err != nil || len(resp.GetAlive()) != 1 {
		t.Fatalf("send after the ended batches: %v, %v", resp, err)
	}
}
