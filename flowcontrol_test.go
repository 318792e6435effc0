package quorumlock_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
)

// HTTP/2 frame types (RFC 9113 section 6).
const (
	h2Data = 0x0
	h2Ping = 0x6
)

// h2Counter parses the HTTP/2 frames of one direction of a plaintext gRPC
// connection and counts them by type.
type h2Counter struct {
	preface int // bytes of the client connection preface still to skip
	buf     []byte
	counts  *frameCounts
}

type frameCounts struct {
	mu     sync.Mutex
	byType map[byte]int
}

func (c *frameCounts) get(typ byte) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byType[typ]
}

func (h *h2Counter) feed(p []byte) {
	if h.preface > 0 {
		n := min(h.preface, len(p))
		h.preface -= n
		p = p[n:]
	}
	h.buf = append(h.buf, p...)
	for len(h.buf) >= 9 {
		n := int(h.buf[0])<<16 | int(binary.BigEndian.Uint16(h.buf[1:3]))
		if len(h.buf) < 9+n {
			return
		}
		h.counts.mu.Lock()
		h.counts.byType[h.buf[3]]++
		h.counts.mu.Unlock()
		h.buf = h.buf[9+n:]
	}
}

// countingConn feeds what a dialed connection writes (after the client
// preface) and reads to counters.
type countingConn struct {
	net.Conn
	wmu, rmu sync.Mutex
	w, r     h2Counter
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.wmu.Lock()
	c.w.feed(p[:n])
	c.wmu.Unlock()
	return n, err
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.rmu.Lock()
	c.r.feed(p[:n])
	c.rmu.Unlock()
	return n, err
}

// Every gRPC connection between replicas has static flow-control windows,
// so gRPC's BDP estimator does not ping the sender after data frames: in a
// lock hand-off, small messages one round trip apart, it pinged for almost
// every message, a ping and its ack costing two more socket writes and
// reads each (client.go, streamWindow). Acquire and release cycles on a
// follower's session (forwarded to the leader, replicated to both
// followers), then on a Client's, exchange hundreds of data frames and no
// pings but gRPC's keepalive ones.
func TestStaticWindowsNoPingPerMessage(t *testing.T) {
	counts := &frameCounts{byType: map[byte]int{}}
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{
			Conn: conn,
			w:    h2Counter{preface: len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), counts: counts},
			r:    h2Counter{counts: counts},
		}, nil
	}
	nodes := specCluster(t, 3, func(c *quorumlock.Config) { c.Dialer = dial })
	lead := specLeader(t, nodes)
	ctx := testCtx(t, 60*time.Second)
	for _, op := range []struct {
		name string
		o    opener
	}{
		{"follower", nodes[(lead+1)%3]},
		{"client", specDial(t, nodes, quorumlock.WithDialer(dial))},
	} {
		s := specSession(ctx, t, op.o)
		cycle := func(i int) {
			l := mustAcquire(t, s, fmt.Sprint("flow/", op.name, i%4))
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 10 { // connections up, windows settled
			cycle(i)
		}
		data0, ping0 := counts.get(h2Data), counts.get(h2Ping)
		const cycles = 200
		for i := range cycles {
			cycle(i)
		}
		data, pings := counts.get(h2Data)-data0, counts.get(h2Ping)-ping0
		t.Logf("%s: %d cycles, %d data frames, %d pings", op.name, cycles, data, pings)
		if data < 2*cycles {
			t.Fatalf("%s: only %d data frames counted for %d cycles: the counter misses the connections", op.name, data, cycles)
		}
		// Keepalive pings come every 10 s at most (dialOptions); the BDP
		// estimator's came about one per data frame, with its ack.
		if pings > 4 {
			t.Errorf("%s: %d HTTP/2 pings over %d data frames: flow-control windows are not static", op.name, pings, data)
		}
	}
}
