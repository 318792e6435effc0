package quorumlock_test

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// tcpProxy is a loopback TCP proxy in front of one replica, with the faults
// of a real network between a client and the replicas: a black hole
// (connections are accepted, nothing is forwarded either way, nothing is
// reset: as a partition, the bytes wait and flow again on restore), one
// direction stalled, a delay on the replies, and a reset of every
// connection (RST). It listens on 127.0.0.1 only.
type tcpProxy struct {
	t      *testing.T
	lis    net.Listener
	target string

	mu     sync.Mutex
	up     chan struct{} // client -> replica flows while closed
	down   chan struct{} // replica -> client flows while closed
	delay  time.Duration // added before each reply chunk is forwarded
	conns  map[net.Conn]struct{}
	dead   map[net.Conn]bool // severed: nothing forwarded, ever, and no reset
	closed bool
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &tcpProxy{t: t, lis: lis, target: target, up: openChan(), down: openChan(), conns: make(map[net.Conn]struct{}), dead: make(map[net.Conn]bool)}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func openChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

func (p *tcpProxy) addr() string { return p.lis.Addr().String() }

func (p *tcpProxy) serve() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *tcpProxy) handle(c net.Conn) {
	// A new connection is accepted in every mode; while the link is down
	// it is not even dialled through until the link is restored, as a
	// SYN would be answered by the proxy's host but the rest lost.
	if !p.wait(func() chan struct{} { return p.up }, c) {
		c.Close()
		return
	}
	s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, s) {
		return
	}
	go p.pipe(c, s, func() chan struct{} { return p.up }, false)
	go p.pipe(s, c, func() chan struct{} { return p.down }, true)
}

func (p *tcpProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// wait blocks until the direction gate returns is open (false once the
// proxy closes).
func (p *tcpProxy) wait(gate func() chan struct{}, _ net.Conn) bool {
	for {
		p.mu.Lock()
		g, closed := gate(), p.closed
		p.mu.Unlock()
		if closed {
			return false
		}
		select {
		case <-g:
			return true
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *tcpProxy) pipe(from, to net.Conn, gate func() chan struct{}, reply bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			// Stalled: the bytes read are held (TCP would retransmit
			// them), and nothing more is read, so the sender's window
			// fills as in a partition.
			for {
				p.mu.Lock()
				g, d, closed, dead := gate(), p.delay, p.closed, p.dead[from]
				p.mu.Unlock()
				if closed {
					return
				}
				if dead {
					// Severed: the bytes are lost, the peer is not told.
					g = nil
				}
				select {
				case <-g:
				case <-time.After(20 * time.Millisecond):
					if !p.live(from) {
						return
					}
					continue
				}
				if reply && d > 0 {
					time.Sleep(d)
				}
				break
			}
			if _, werr := to.Write(buf[:n]); werr != nil {
				p.resetPair(from, to)
				return
			}
		}
		if err != nil {
			if err == io.EOF {
				if tc, ok := to.(*net.TCPConn); ok {
					tc.CloseWrite()
					return
				}
			}
			p.resetPair(from, to)
			return
		}
	}
}

func (p *tcpProxy) live(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.conns[c]
	return ok
}

func (p *tcpProxy) resetPair(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close()
	}
}

// blackhole stops forwarding in both directions (no reset).
func (p *tcpProxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.up, p.down = make(chan struct{}), make(chan struct{})
}

// stallReplies stops forwarding from the replica to the client only.
func (p *tcpProxy) stallReplies() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = make(chan struct{})
}

// stallRequests stops forwarding from the client to the replica only.
func (p *tcpProxy) stallRequests() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.up = make(chan struct{})
}

// setDelay delays every reply chunk by d.
func (p *tcpProxy) setDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// restore forwards both ways again, without delay; held bytes flow.
func (p *tcpProxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range []chan struct{}{p.up, p.down} {
		select {
		case <-g:
		default:
			close(g)
		}
	}
	p.delay = 0
}

// sever makes every proxied connection silent for good (as a middlebox
// that forgot its state: no reset, nothing forwarded); new connections
// pass.
func (p *tcpProxy) sever() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		p.dead[c] = true
	}
}

// reset closes every proxied connection with an RST.
func (p *tcpProxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
		delete(p.conns, c)
	}
}

func (p *tcpProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.lis.Close()
	p.reset()
}
