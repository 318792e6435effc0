package quorumlock_test

import (
	"context"
	"fmt"
	"net"
	"slices"
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

// specLeader waits until the replicas agree on a leader and returns its
// index; the nodes at the indices in skip (stopped ones) are not asked.
func specLeader(t *testing.T, nodes []*quorumlock.Node, skip ...int) int {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for i, n := range nodes {
			if slices.Contains(skip, i) {
				continue
			}
			if st := n.Status(); st.Leader == st.ID {
				return i
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader within 15 s")
	return -1
}

// specAddrs returns the addresses of the nodes at the indices in idx, in
// that order, or of every node if idx is empty.
func specAddrs(nodes []*quorumlock.Node, idx ...int) []string {
	if len(idx) == 0 {
		for i := range nodes {
			idx = append(idx, i)
		}
	}
	var addrs []string
	for _, i := range idx {
		addrs = append(addrs, nodes[i].Addr().String())
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
