package testcluster

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Network is a fault-injecting view of loopback TCP between the replicas of
// a test cluster. Every connection a replica opens goes through its dialer,
// so links can be cut (one way or both), delayed or made lossy, per ordered
// pair of members. A cut link fails new dials and stalls writes on existing
// connections, as a black-holing network does; Partition also closes the
// connections that cross it.
type Network struct {
	mu    sync.Mutex
	addrs map[string]uint64 // address -> member
	links map[link]*linkState
	conns map[*faultConn]struct{}
	rnd   *rand.Rand
}

type link struct{ from, to uint64 }

type linkState struct {
	cut   bool
	delay time.Duration
	drop  float64
	heal  chan struct{} // closed when the cut is lifted
}

// ErrLinkCut is returned by a dial over a cut link.
var ErrLinkCut = errors.New("testcluster: link cut")

func newNetwork(seed uint64) *Network {
	return &Network{
		addrs: make(map[string]uint64),
		links: make(map[link]*linkState),
		conns: make(map[*faultConn]struct{}),
		rnd:   rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
}

func (nw *Network) register(id uint64, addr string) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.addrs[addr] = id
}

func (nw *Network) state(l link) *linkState {
	s := nw.links[l]
	if s == nil {
		s = &linkState{heal: make(chan struct{})}
		nw.links[l] = s
	}
	return s
}

// Dialer returns the dialer member from uses.
func (nw *Network) Dialer(from uint64) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		nw.mu.Lock()
		to := nw.addrs[addr]
		cut := nw.state(link{from, to}).cut || nw.state(link{to, from}).cut
		nw.mu.Unlock()
		if cut {
			return nil, ErrLinkCut
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		fc := &faultConn{Conn: c, nw: nw, out: link{from, to}, in: link{to, from}}
		nw.mu.Lock()
		nw.conns[fc] = struct{}{}
		nw.mu.Unlock()
		return fc, nil
	}
}

// Cut makes the link from -> to lose everything until Heal.
func (nw *Network) Cut(from, to uint64) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.state(link{from, to}).cut = true
}

// Partition cuts every link between members of different groups, both ways,
// and closes the connections that cross groups. Members in no group are
// left as they are.
func (nw *Network) Partition(groups ...[]uint64) {
	group := make(map[uint64]int)
	for i, g := range groups {
		for _, id := range g {
			group[id] = i + 1
		}
	}
	nw.mu.Lock()
	for a, ga := range group {
		for b, gb := range group {
			if ga != gb {
				nw.state(link{a, b}).cut = true
			}
		}
	}
	var doomed []*faultConn
	for c := range nw.conns {
		ga, gb := group[c.out.from], group[c.out.to]
		if ga != 0 && gb != 0 && ga != gb {
			doomed = append(doomed, c)
		}
	}
	nw.mu.Unlock()
	for _, c := range doomed {
		c.Close()
	}
}

// Isolate cuts id off from every other member, both ways.
func (nw *Network) Isolate(id uint64, others []uint64) {
	var rest []uint64
	for _, o := range others {
		if o != id {
			rest = append(rest, o)
		}
	}
	nw.Partition([]uint64{id}, rest)
}

// SetDelay delays every write on the link from -> to by d. The delay is
// taken in the writer, one write after another, and the same wait applies
// to each read of a connection that to dialed to from (faults act on the
// dialing side: see Dialer). So a message can wait up to about 2d (it
// queues behind the write or read in progress), and a connection carries
// at most one write per d: keep d well below the election timeout, or the
// link is slower than raft's timing assumptions.
func (nw *Network) SetDelay(from, to uint64, d time.Duration) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.state(link{from, to}).delay = d
}

// SetDrop makes each write on the link from -> to fail with probability p,
// breaking the connection (what is in flight is lost; the sender
// reconnects).
func (nw *Network) SetDrop(from, to uint64, p float64) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.state(link{from, to}).drop = p
}

// Heal lifts every cut, delay and drop.
func (nw *Network) Heal() {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	for l, s := range nw.links {
		if s.cut {
			close(s.heal)
		}
		delete(nw.links, l)
	}
}

// writeFault returns what to do with a write on link l: wait for heal (a
// channel) if cut, the delay, and whether to drop it.
func (nw *Network) writeFault(l link) (heal chan struct{}, delay time.Duration, drop bool) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	s := nw.links[l]
	if s == nil {
		return nil, 0, false
	}
	if s.cut {
		return s.heal, 0, false
	}
	return nil, s.delay, s.drop > 0 && nw.rnd.Float64() < s.drop
}

func (nw *Network) forget(c *faultConn) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	delete(nw.conns, c)
}

// faultConn applies the faults of its links: writes travel out (dialer ->
// listener), reads bring data in (listener -> dialer).
type faultConn struct {
	net.Conn
	nw       *Network
	out, in  link
	closeMu  sync.Once
	closed   chan struct{}
	initOnce sync.Once
}

func (c *faultConn) done() chan struct{} {
	c.initOnce.Do(func() { c.closed = make(chan struct{}) })
	return c.closed
}

func (c *faultConn) Write(b []byte) (int, error) {
	if err := c.fault(c.out); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

func (c *faultConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		if ferr := c.fault(c.in); ferr != nil {
			return 0, ferr
		}
	}
	return n, err
}

func (c *faultConn) fault(l link) error {
	heal, delay, drop := c.nw.writeFault(l)
	if heal != nil {
		// A cut link black-holes traffic: stall until healed or closed.
		select {
		case <-heal:
		case <-c.done():
			return net.ErrClosed
		}
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-c.done():
			return net.ErrClosed
		}
	}
	if drop {
		c.Close()
		return net.ErrClosed
	}
	return nil
}

func (c *faultConn) Close() error {
	c.closeMu.Do(func() {
		close(c.done())
		c.nw.forget(c)
	})
	return c.Conn.Close()
}
