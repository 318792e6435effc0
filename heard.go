package quorumlock

import (
	"context"
	"sync/atomic"
	"time"

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
