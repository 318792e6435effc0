package quorumlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// connHeard is the gRPC stats handler of one connection to a replica: it
// records when the connection last received anything of any call on it (a
// message, headers, trailers). A heartbeat batch unanswered for its whole
// time on a connection that heard nothing meanwhile marks the connection
// dead, and it is dialled again (Client.redial, router.redial); one that
// heard other answers meanwhile is slow, not dead, and is kept: dropping
// it would also break the calls that its answers are on their way to.
// Times are of the real clock: this is about the network, not leases.
type connHeard struct{ at atomic.Int64 } // time.Now().UnixNano()

// heardSince reports whether the connection received anything at or
// after t.
func (h *connHeard) heardSince(t time.Time) bool { return h.at.Load() >= t.UnixNano() }

func (h *connHeard) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (h *connHeard) HandleRPC(_ context.Context, s stats.RPCStats) {
	switch s.(type) {
	case *stats.InPayload, *stats.InHeader, *stats.InTrailer:
		h.at.Store(time.Now().UnixNano())
	}
}

func (h *connHeard) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (h *connHeard) HandleConn(context.Context, stats.ConnStats) {}

// connMaps are the connections a Client (by address) or a replica's router
// (by member ID) holds to replicas, with each one's connHeard and the
// heartbeat and propose streams on it. The holder's mutex guards them.
type connMaps[K comparable] struct {
	conns map[K]*grpc.ClientConn
	heard map[*grpc.ClientConn]*connHeard
	ka    map[K]*kaStream
	ps    map[K]*propStream
	// opens are the holder's NewSession calls, which its propose streams
	// consult about the answers of abandoned opens (openCalls).
	opens *openCalls
}

func newConnMaps[K comparable]() connMaps[K] {
	return connMaps[K]{
		conns: make(map[K]*grpc.ClientConn),
		heard: make(map[*grpc.ClientConn]*connHeard),
		ka:    make(map[K]*kaStream),
		ps:    make(map[K]*propStream),
		opens: newOpenCalls(),
	}
}

// dial creates the connection to addr for key, with opts and a connHeard
// of its own, and holds it. The holder's mutex is held.
func (m *connMaps[K]) dial(key K, addr string, opts []grpc.DialOption) (*grpc.ClientConn, error) {
	h := &connHeard{}
	cc, err := grpc.NewClient(addr, append(opts, grpc.WithStatsHandler(h))...)
	if err != nil {
		return nil, err
	}
	m.conns[key] = cc
	m.heard[cc] = h
	return cc, nil
}

// redialSilent forgets cc, the connection at key, after a heartbeat batch
// (or, for a Client or replica without sessions, a request attempt) sent
// on it at sent went unanswered for its whole time, unless cc was
// replaced or received anything since (slow, not dead): the next request
// dials a new connection. A connection that died silently (a middlebox that dropped
// its state, a link that black-holed it, with no reset) is otherwise used
// until gRPC's keepalive gives up on it, 10-20 s later, and every
// heartbeat meanwhile goes into it: a session lost its lease while the
// replica answered new connections at once (a follower's NOT_LEADER hint
// sends the caller back to the leader, over the same dead connection).
// The streams on cc end now, so the calls and batches waiting on them go
// on elsewhere; closing cc may wait (gRPC gives its GOAWAY up to 5 s), so
// it is closed through background, or at once if background refuses (the
// holder is closing, and no longer holds cc among the connections it
// closes). mu guards m and is not held by the caller.
func (m *connMaps[K]) redialSilent(mu *sync.Mutex, key K, cc *grpc.ClientConn, sent time.Time, background func(func()) bool) {
	mu.Lock()
	if m.conns[key] != cc || m.heard[cc].heardSince(sent) {
		mu.Unlock()
		return
	}
	delete(m.conns, key)
	delete(m.heard, cc)
	ka, ps := m.ka[key], m.ps[key]
	delete(m.ka, key)
	delete(m.ps, key)
	mu.Unlock()
	if ka != nil {
		ka.close()
	}
	if ps != nil {
		ps.close()
	}
	if !background(func() { cc.Close() }) {
		cc.Close()
	}
}

// attemptEnded is called when a request attempt sent on cc, the
// connection at key, at sent failed; hb is the holder's heartbeater. A
// Client or replica without sessions sends no heartbeats, so its requests
// are what notice a connection that died without a reset: if the
// attempt's own limit ended it (not the caller's ctx: the replica did not
// answer in twice the election timeout), cc is dialled again unless it
// received anything meanwhile (redialSilent). Without this, every request
// went back into the dead connection, by the leader hints of the other
// replicas, until gRPC's keepalive gave up on it (10-20 s). With sessions
// the heartbeats are the probe: a request slower than its attempt limit
// on a slow link that still delivers must not break the heartbeat stream
// sharing its connection.
func (m *connMaps[K]) attemptEnded(mu *sync.Mutex, hb *heartbeater, ctx, actx context.Context, key K, cc *grpc.ClientConn, sent time.Time) {
	if ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) && hb.idle() {
		m.redialSilent(mu, key, cc, sent, hb.background)
	}
}

// closeAll ends every stream, closes every connection and forgets them.
// The holder's mutex is held.
func (m *connMaps[K]) closeAll() {
	for _, s := range m.ka {
		s.close()
	}
	for _, s := range m.ps {
		s.close()
	}
	for _, cc := range m.conns {
		cc.Close()
	}
	clear(m.ka)
	clear(m.ps)
	clear(m.conns)
	clear(m.heard)
}
