package quorumlock_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// peerLinks is a cluster whose replicas dial each other (raft transport
// and router) through a tcpProxy per (from, to) pair of addresses.
type peerLinks struct {
	*testcluster.Cluster
	mu    sync.Mutex
	links map[[2]string]*tcpProxy
}

func newPeerLinks(t *testing.T, size int) *peerLinks {
	pl := &peerLinks{links: make(map[[2]string]*tcpProxy)}
	pl.Cluster = testcluster.New(t, testcluster.Options{Size: size, Configure: func(cfg *quorumlock.Config) {
		from := cfg.Peers[cfg.ID]
		cfg.Dialer = func(ctx context.Context, addr string) (net.Conn, error) {
			pl.mu.Lock()
			p := pl.links[[2]string{from, addr}]
			if p == nil {
				p = newTCPProxy(t, addr)
				pl.links[[2]string{from, addr}] = p
			}
			pl.mu.Unlock()
			var d net.Dialer
			return d.DialContext(ctx, "tcp", p.addr())
		}
	}})
	return pl
}

// link returns the proxy of the connections replica from dialled to
// replica to (nil if it dialled none).
func (pl *peerLinks) link(from, to uint64) *tcpProxy {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.links[[2]string{pl.Peers()[from], pl.Peers()[to]}]
}

// A follower replica with no sessions sends no heartbeats, so its
// forwarded requests are what notice a router connection to the leader
// that died without a reset: NewSession gets through on a new connection
// well before gRPC's keepalive (10-20 s) would give up on the dead one.
// Before, the forwarded open waited on the dead connection (the router
// bounded no attempt) until keepalive or the caller's ctx ended it.
func TestReviewTSilentlyDeadRouterConnectionOfSessionlessReplica(t *testing.T) {
	c := newPeerLinks(t, 3)
	lead := c.WaitLeader(5 * time.Second)
	f := follower(c.Cluster, lead)
	ctx := testCtx(t, 30*time.Second)
	// One session, opened and closed, makes the router's connection.
	s, err := c.Node(f).NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		c.link(f, lead).sever()
		// An attempt is bounded by twice the 100 ms election timeout:
		// one into the dead connection, then a new one.
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := c.Node(f).NewSession(cctx)
		if err == nil {
			err = s.Close(cctx)
		}
		cancel()
		if err != nil {
			t.Fatalf("NewSession %d after the router's connection to the leader died silently: %v", i, err)
		}
	}
}

// A nil Fence (a resource whose fence was never made) and a nil or zero
// Node or Client (the nil of a failed Start or Dial) are misuse the API
// answers with errors, not panics: a nil Fence admits no token
// (ErrInvalidConfig: it could record none, and a resource must not run
// unfenced) and has admitted none; every call of a nil or zero Node or
// Client that returns an error returns ErrClosed, and its channels are
// closed. Before, each of these calls panicked on the nil pointer.
func TestReviewTNilFenceNodeClient(t *testing.T) {
	ctx := testCtx(t, 10*time.Second)
	var f *quorumlock.Fence
	reviewJNoPanic(t, "nil Fence", func() {
		if err := f.Admit("r", 5); !errors.Is(err, quorumlock.ErrInvalidConfig) {
			t.Errorf("Admit on a nil Fence: %v", err)
		}
		if h := f.Highest("r"); h != 0 {
			t.Errorf("Highest on a nil Fence: %d", h)
		}
	})
	isClosed := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, quorumlock.ErrClosed) {
			t.Errorf("%s: %v, want ErrClosed", what, err)
		}
	}
	for _, n := range []*quorumlock.Node{nil, new(quorumlock.Node)} {
		reviewJNoPanic(t, "Node methods", func() {
			_, err := n.NewSession(ctx)
			isClosed("Node.NewSession", err)
			_, err = n.Holder(ctx, "a")
			isClosed("Node.Holder", err)
			_, err = n.Leader(ctx, "r")
			isClosed("Node.Leader", err)
			_, err = n.Elect(ctx, "r", nil)
			isClosed("Node.Elect", err)
			isClosed("Node.Err", n.Err())
			isClosed("Node.Close", n.Close())
			isClosed("Node.HardClose", n.HardClose())
			if _, ok := <-n.Observe(ctx, "r"); ok || !closed(n.Done()) || n.ID() != 0 || n.Addr() != nil || n.Status() != (quorumlock.Status{}) {
				t.Errorf("nil or zero Node: Observe gave an event %v, Done closed %v, ID %d, Addr %v, Status %+v", ok, closed(n.Done()), n.ID(), n.Addr(), n.Status())
			}
		})
	}
	for _, c := range []*quorumlock.Client{nil, new(quorumlock.Client)} {
		reviewJNoPanic(t, "Client methods", func() {
			_, err := c.NewSession(ctx)
			isClosed("Client.NewSession", err)
			_, err = c.Holder(ctx, "a")
			isClosed("Client.Holder", err)
			_, err = c.Leader(ctx, "r")
			isClosed("Client.Leader", err)
			_, err = c.Elect(ctx, "r", nil)
			isClosed("Client.Elect", err)
			_, _, err = c.Locks(ctx, "", 0)
			isClosed("Client.Locks", err)
			_, _, err = c.Sessions(ctx, 0, 0)
			isClosed("Client.Sessions", err)
			isClosed("Client.RevokeSession", c.RevokeSession(ctx, 1))
			isClosed("Client.Close", c.Close())
			if _, ok := <-c.Observe(ctx, "r"); ok || len(c.Status(ctx)) != 0 {
				t.Errorf("nil or zero Client: Observe gave an event %v, Status %v", ok, c.Status(ctx))
			}
		})
	}
}
