package quorumlock_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
)

// specCluster starts size replicas with quorumlock.Start on 127.0.0.1
// listeners, as the README shows, with a short tick so elections are quick.
// mutate, if given, adjusts each replica's Config.
func specCluster(t *testing.T, size int, mutate func(*quorumlock.Config)) []*quorumlock.Node {
	t.Helper()
	peers := make(map[uint64]string, size)
	lis := make([]net.Listener, size)
	for i := range size {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis[i] = l
		peers[uint64(i+1)] = l.Addr().String()
	}
	nodes := make([]*quorumlock.Node, size)
	for i := range size {
		cfg := quorumlock.Config{
			ID:            uint64(i + 1),
			Peers:         peers,
			DataDir:       t.TempDir(),
			Listener:      lis[i],
			TickInterval:  20 * time.Millisecond,
			ElectionTicks: 10,
		}
		if mutate != nil {
			mutate(&cfg)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n, err := quorumlock.Start(ctx, cfg)
		cancel()
		if err != nil {
			t.Fatalf("Start replica %d: %v", i+1, err)
		}
		nodes[i] = n
		t.Cleanup(func() { n.Close() })
	}
	return nodes
}

// specLeader waits until the replicas agree on a leader and returns its index.
func specLeader(t *testing.T, nodes []*quorumlock.Node) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for i, n := range nodes {
			if st := n.Status(); st.Leader == st.ID {
				return i
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader within 10 s")
	return -1
}

func specAddrs(nodes []*quorumlock.Node) []string {
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr().String())
	}
	return addrs
}

func specDial(t *testing.T, nodes []*quorumlock.Node, opts ...quorumlock.ClientOption) *quorumlock.Client {
	t.Helper()
	opts = append([]quorumlock.ClientOption{quorumlock.WithElectionTimeout(200 * time.Millisecond)}, opts...)
	c, err := quorumlock.Dial(testCtx(t, 10*time.Second), specAddrs(nodes), opts...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// opener is what a Node and a Client have in common for sessions.
type opener interface {
	NewSession(context.Context, ...quorumlock.SessionOption) (*quorumlock.Session, error)
	Holder(context.Context, string) (quorumlock.LockInfo, error)
	Leader(context.Context, string) (quorumlock.LeaderInfo, error)
	Observe(context.Context, string) <-chan quorumlock.LeaderInfo
	Elect(context.Context, string, []byte) (*quorumlock.Leadership, error)
}

// specOpeners returns a follower replica and a remote client of nodes.
func specOpeners(t *testing.T, nodes []*quorumlock.Node) []struct {
	name string
	o    opener
} {
	lead := specLeader(t, nodes)
	f := nodes[(lead+1)%len(nodes)]
	return []struct {
		name string
		o    opener
	}{{fmt.Sprintf("replica%d", f.ID()), f}, {"client", specDial(t, nodes)}}
}

// specSession opens a session through o; it is closed when the test ends.
func specSession(ctx context.Context, t *testing.T, o opener, opts ...quorumlock.SessionOption) *quorumlock.Session {
	t.Helper()
	s, err := o.NewSession(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Close(cctx)
	})
	return s
}
