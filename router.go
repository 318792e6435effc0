package quorumlock

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/raftnode"
)

// backend is how a session reaches the leader: a replica routes through its
// own raft view (router); a remote client through its connections.
type backend interface {
	// propose sends req to the leader, following NOT_LEADER hints and
	// re-sending the same request (same session and seq) after a lost
	// leader, until an answer or ctx's end.
	propose(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error)
	// keepAlive sends one heartbeat batch to the leader (a single attempt).
	keepAlive(ctx context.Context, ids []uint64) (alive, gone []uint64, err error)
	// settleGrace is how long settling an interrupted acquire may take
	// before the call returns ErrWithdrawPending (and the withdrawal goes
	// on in the background): an election timeout.
	settleGrace() time.Duration
}

// errNoLeader is returned by keepAlive when no leader could be reached.
var errNoLeader = errors.New("quorumlock: no leader reachable")

// router sends a replica's client requests to the leader: in process when
// this replica leads, over gRPC to the leader's address otherwise.
type router struct {
	n *Node

	mu sync.Mutex
	// The connections to the leaders, by member ID (guarded by mu).
	cm connMaps[uint64]
}

func newRouter(n *Node) *router {
	return &router{n: n, cm: newConnMaps[uint64]()}
}

// retry backoff between attempts that found no leader: from minBackoff,
// doubling, up to a tenth of the election timeout (at most maxBackoff), so
// a new leader is found well within two election timeouts.
const (
	minBackoff = 5 * time.Millisecond
	maxBackoff = 200 * time.Millisecond
)

func backoffCap(electionTimeout time.Duration) time.Duration {
	return max(minBackoff, min(maxBackoff, electionTimeout/10))
}

func (r *router) propose(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
	backoff := minBackoff
	var hint uint64
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		changed := r.n.raft.LeaderChanged()
		target := hint
		if target == 0 {
			target = r.n.raft.Status().Leader
		}
		hint = 0
		if target != 0 {
			resp, err := r.attempt(ctx, target, changed, req)
			switch {
			case err == nil && resp.GetCode() == lockpb.Code_CODE_NOT_LEADER:
				if h := resp.GetLeaderHint(); h != 0 && h != target {
					hint = h
					continue
				}
			case err == nil && resp.GetCode() == lockpb.Code_CODE_UNAVAILABLE:
			case err == nil:
				return resp, nil
			case ctx.Err() != nil:
				return nil, ctx.Err()
			}
		}
		select {
		case <-time.After(backoff):
		case <-changed:
			// A link that failed before may work now: redial at once the
			// connections gRPC holds in its reconnect backoff (1 s and
			// growing), during which every RPC fails with the old error.
			r.resetConnectBackoff()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		backoff = min(backoff*2, backoffCap(r.n.cfg.electionTimeout()))
	}
}

// attempt sends req once to target. A remote attempt is abandoned when this
// replica learns of a new leader or term, so a request stuck at a deposed
// leader moves on.
func (r *router) attempt(ctx context.Context, target uint64, changed <-chan struct{}, req *lockpb.Request) (*lockpb.Response, error) {
	if target == r.n.cfg.ID {
		resp, err := r.n.svc.Propose(ctx, req)
		if errors.Is(err, raftnode.ErrStopped) {
			return nil, ErrClosed
		}
		return resp, err
	}
	// Without sessions this replica sends no heartbeats, so its forwarded
	// requests are what notice a connection to the leader that died
	// without a reset: such an attempt is bounded, by twice the election
	// timeout as a Client's (attemptEnded). A blocking acquire has a
	// session, so it is never bounded here.
	var cc *grpc.ClientConn
	actx, cancel := ctx, context.CancelFunc(func() {})
	if r.n.hb.idle() {
		var err error
		if cc, err = r.conn(target); err != nil {
			return nil, err
		}
		actx, cancel = context.WithTimeout(ctx, 2*r.n.cfg.electionTimeout())
	}
	defer cancel()
	sent := time.Now()
	// A change of leader or term abandons the attempt: the router sends it
	// again to whoever leads now.
	ps, err := cachedPropStream(actx, changed, &r.mu, r.cm.ps, target, r.cm.opens, func() (*grpc.ClientConn, error) {
		if cc != nil {
			return cc, nil
		}
		return r.conn(target)
	})
	if err == nil {
		var resp *lockpb.Response
		if resp, err = ps.call(actx, changed, req); err == nil {
			return resp, nil
		}
	}
	if cc != nil {
		r.cm.attemptEnded(&r.mu, r.n.hb, ctx, actx, target, cc, sent)
	}
	return nil, grpcErr(ctx, err)
}

func (r *router) settleGrace() time.Duration { return r.n.cfg.electionTimeout() }

func (r *router) keepAlive(ctx context.Context, ids []uint64) (alive, gone []uint64, err error) {
	target := r.n.raft.Status().Leader
	for range 2 {
		if target == 0 {
			return nil, nil, errNoLeader
		}
		var resp *lockpb.KeepAliveResponse
		if target == r.n.cfg.ID {
			a, g, code, hint := r.n.svc.Heartbeat(ctx, ids)
			resp = &lockpb.KeepAliveResponse{Alive: a, Expired: g, Code: code, LeaderHint: hint}
		} else {
			s, cc, err := r.stream(target)
			if err != nil {
				return nil, nil, err
			}
			sent := time.Now()
			if resp, err = s.send(ctx, ids); err != nil {
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					// No answer in the batch's whole time: the leader is
					// silent, or the connection died without a reset.
					r.redial(target, cc, sent)
				}
				return nil, nil, err
			}
		}
		if resp.GetCode() == lockpb.Code_CODE_OK {
			return resp.GetAlive(), resp.GetExpired(), nil
		}
		target = resp.GetLeaderHint()
	}
	return nil, nil, errNoLeader
}

func (r *router) conn(id uint64) (*grpc.ClientConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cc, ok := r.cm.conns[id]; ok {
		return cc, nil
	}
	if r.n.isClosed() {
		// A forwarded call or heartbeat racing with Close: a connection
		// opened now would never be closed (Close marks the node closed
		// before it closes the router).
		return nil, ErrClosed
	}
	addr, ok := r.n.cfg.Peers[id]
	if !ok {
		return nil, errNoLeader
	}
	return r.cm.dial(id, addr, dialOptions(r.n.cfg.PeerTLS, r.n.cfg.Dialer))
}

func (r *router) stream(id uint64) (*kaStream, *grpc.ClientConn, error) {
	cc, err := r.conn(id)
	if err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.cm.ka[id]
	if s == nil || s.broken() {
		s = newKAStream(cc)
		r.cm.ka[id] = s
	}
	return s, cc, nil
}

// redial forgets cc, the connection to replica id, after a heartbeat batch
// (or a forwarded attempt, attemptEnded) sent on it at sent went
// unanswered for its whole time, unless cc heard anything since
// (connMaps.redialSilent): a connection that died without a reset would
// otherwise carry every heartbeat of this replica's sessions, and every
// forwarded call, until gRPC's keepalive gives up on it, while a new
// connection to the leader works.
func (r *router) redial(id uint64, cc *grpc.ClientConn, sent time.Time) {
	r.cm.redialSilent(&r.mu, id, cc, sent, r.n.hb.background)
}

// resetConnectBackoff makes every connection in gRPC's reconnect backoff
// dial again now. Only connections in TRANSIENT_FAILURE are touched: gRPC
// v1.85's ResetConnectBackoff walks its subconnection map after releasing
// the lock that guards it, which races with a connection creating its
// first subconnection (seen by the race detector); one in backoff has it.
func (r *router) resetConnectBackoff() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, cc := range r.cm.conns {
		if cc.GetState() == connectivity.TransientFailure {
			cc.ResetConnectBackoff()
		}
	}
}

func (r *router) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cm.closeAll()
}

// grpcErr maps a gRPC error under ctx to ctx's error when ctx ended.
func grpcErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if s, ok := status.FromError(err); ok && (s.Code() == codes.Canceled || s.Code() == codes.DeadlineExceeded) && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// chanCtx is a context that is cancelled when c closes.
type chanCtx <-chan struct{}

func (c chanCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c chanCtx) Done() <-chan struct{}       { return c }
func (c chanCtx) Value(any) any               { return nil }
func (c chanCtx) Err() error {
	select {
	case <-c:
		return context.Canceled
	default:
		return nil
	}
}
