package quorumlock_test

import (
	"context"
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
