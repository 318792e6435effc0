package quorumlock

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// The heartbeats of many sessions of one client share batched requests on
// one stream: far fewer requests than sessions x intervals.
func TestClientBatchesHeartbeats(t *testing.T) {
	_, addr := startOne(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, []string{addr}, WithSessionTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const sessions = 300
	var all []*Session
	for range sessions {
		s, err := c.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, s)
	}
	// Three heartbeat intervals (TTL/3 each).
	time.Sleep(3 * time.Second)
	c.mu.Lock()
	var requests uint64
	streams := len(c.cm.ka)
	for _, s := range c.cm.ka {
		s.mu.Lock()
		requests += s.next
		s.mu.Unlock()
	}
	c.mu.Unlock()
	for _, s := range all {
		if isDone(s.Done()) {
			t.Fatalf("session %d ended: %v", s.ID(), s.Err())
		}
	}
	// One per session per interval would be 900.
	if streams != 1 || requests == 0 || requests > 12 {
		t.Fatalf("%d heartbeat requests on %d streams for %d sessions over 3 intervals", requests, streams, sessions)
	}
	t.Logf("%d heartbeat requests for %d sessions over 3 intervals", requests, sessions)
}

// startOne starts a one-replica cluster on loopback (10 ms ticks, 3 s
// session TTL), closed when the test ends, and returns it with its address.
func startOne(t *testing.T) (*Node, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := Start(ctx, Config{
		ID: 1, Peers: map[uint64]string{1: lis.Addr().String()}, DataDir: t.TempDir(), Listener: lis,
		TickInterval: 10 * time.Millisecond, SessionTTL: 3 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, lis.Addr().String()
}

// A retry or stream that asks for a connection after Close (a race with
// Close) is refused instead of opening one that nothing would close; the
// same for a replica's router.
func TestNoConnectionAfterClose(t *testing.T) {
	n, addr := startOne(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, []string{addr})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.conn(addr); err != nil {
		t.Fatalf("conn before Close: %v", err)
	}
	c.Close()
	if cc, err := c.conn(addr); !errors.Is(err, ErrClosed) {
		t.Fatalf("conn after Close = %v, %v; want ErrClosed", cc, err)
	}
	c.mu.Lock()
	left := len(c.cm.conns)
	c.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d connections recorded after Close", left)
	}

	n.Close()
	if cc, err := n.router.conn(n.ID()); !errors.Is(err, ErrClosed) {
		t.Fatalf("router conn after close = %v, %v; want ErrClosed", cc, err)
	}
}

// An error about a huge name quotes only its start: the message stays
// readable (names may be up to MaxNameBytesLimit).
func TestInvalidNameErrorStaysShort(t *testing.T) {
	name := strings.Repeat("n", 100_000) + "\x00"
	err := checkName(name, 1024)
	if !errors.Is(err, ErrInvalidName) {
		t.Fatalf("checkName: %v, want ErrInvalidName", err)
	}
	if msg := err.Error(); len(msg) > 300 || !strings.Contains(msg, "100001 bytes") {
		t.Fatalf("message of %d bytes: %.400s", len(msg), msg)
	}
}
