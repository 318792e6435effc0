// Command quickstart runs a real five-replica quorumlock cluster on
// loopback and walks through what it guarantees: mutual exclusion, FIFO
// hand-off with growing fencing tokens, a resource that rejects stale
// tokens, leader failover with the lock table intact, and a holder whose
// replica dies losing its lock safely. It prints a narrative and exits 0.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/quorumlock/quorumlock"
)

const ttl = 3 * time.Second

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart failed:", err)
		os.Exit(1)
	}
}

// storage is the protected resource: it accepts a write only with a token
// at least as high as any it has seen (a Fence).
type storage struct {
	fence *quorumlock.Fence
	data  map[string]string
}

func (s *storage) write(key, val string, t quorumlock.Token) error {
	if err := s.fence.Admit(key, t); err != nil {
		return err
	}
	s.data[key] = val
	return nil
}

func run() error {
	// Interrupted, the walkthrough stops where it is and still closes the
	// replicas and removes their data; a second signal kills it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	dir, err := os.MkdirTemp("", "quorumlock-quickstart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	// Five replicas, each on its own loopback port and data directory.
	peers := map[uint64]string{}
	listeners := map[uint64]net.Listener{}
	for id := uint64(1); id <= 5; id++ {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		listeners[id], peers[id] = lis, lis.Addr().String()
	}
	nodes := map[uint64]*quorumlock.Node{}
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	for id := uint64(1); id <= 5; id++ {
		n, err := quorumlock.Start(ctx, quorumlock.Config{
			ID:            id,
			Peers:         peers,
			DataDir:       filepath.Join(dir, fmt.Sprint(id)),
			Listener:      listeners[id],
			SessionTTL:    ttl,
			TickInterval:  50 * time.Millisecond,
			ElectionTicks: 10,
		})
		if err != nil {
			return err
		}
		nodes[id] = n
	}
	leader, err := waitLeader(ctx, nodes)
	if err != nil {
		return err
	}
	fmt.Printf("1. Started 5 replicas on loopback; replica %d was elected leader (term %d).\n",
		leader, nodes[leader].Status().Term)

	// Sessions on three different followers, so requests travel to the
	// leader over gRPC.
	var followers []uint64
	for id := uint64(1); id <= 5; id++ {
		if id != leader {
			followers = append(followers, id)
		}
	}
	alice, err := nodes[followers[0]].NewSession(ctx)
	if err != nil {
		return err
	}
	bob, err := nodes[followers[1]].NewSession(ctx)
	if err != nil {
		return err
	}
	carol, err := nodes[followers[2]].NewSession(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("2. Opened sessions: alice (%d) on replica %d, bob (%d) on replica %d, carol (%d) on replica %d; TTL %v.\n",
		alice.ID(), followers[0], bob.ID(), followers[1], carol.ID(), followers[2], ttl)

	store := &storage{fence: quorumlock.NewFence(), data: map[string]string{}}

	la, err := alice.Acquire(ctx, "inventory")
	if err != nil {
		return err
	}
	if err := store.write("inventory", "alice was here", la.Token()); err != nil {
		return err
	}
	fmt.Printf("3. alice acquired \"inventory\" with fencing token %d and wrote to the store.\n", la.Token())

	bobGot := make(chan *quorumlock.Lock, 1)
	bobErr := make(chan error, 1)
	go func() {
		l, err := bob.Acquire(ctx, "inventory")
		if err != nil {
			bobErr <- err
			return
		}
		bobGot <- l
	}()
	if err := waitWaiting(ctx, nodes[leader], "inventory", bob.ID()); err != nil {
		return err
	}
	if _, err := carol.TryAcquire(ctx, "inventory"); !errors.Is(err, quorumlock.ErrLocked) {
		return fmt.Errorf("carol's TryAcquire: want ErrLocked, got %v", err)
	}
	fmt.Println("4. bob is queued behind alice; carol's TryAcquire fails at once with ErrLocked.")

	if err := la.Release(ctx); err != nil {
		return err
	}
	var lb *quorumlock.Lock
	select {
	case lb = <-bobGot:
	case err := <-bobErr:
		return err
	}
	if lb.Token() <= la.Token() {
		return fmt.Errorf("bob's token %d is not above alice's %d", lb.Token(), la.Token())
	}
	if err := store.write("inventory", "bob was here", lb.Token()); err != nil {
		return err
	}
	fmt.Printf("5. alice released; bob was granted the lock with a larger token %d and wrote.\n", lb.Token())

	err = store.write("inventory", "alice again, late", la.Token())
	if !errors.Is(err, quorumlock.ErrStaleToken) {
		return fmt.Errorf("stale write: want ErrStaleToken, got %v", err)
	}
	fmt.Printf("6. A late write carrying alice's old token %d is rejected by the store: %v\n", la.Token(), err)

	// Fail over: the leader replica stops the way a crash does (HardClose;
	// Close would first hand leadership to a follower).
	old := leader
	start := time.Now()
	nodes[old].HardClose()
	delete(nodes, old)
	leader, err = waitLeader(ctx, nodes)
	if err != nil {
		return err
	}
	info, err := nodes[leader].Holder(ctx, "inventory")
	if err != nil {
		return err
	}
	if info.Holder != bob.ID() || info.Token != lb.Token() {
		return fmt.Errorf("after failover the table says %+v", info)
	}
	fmt.Printf("7. Leader replica %d stopped as in a crash (HardClose); replica %d took over (term %d) after %v. The lock table is intact: \"inventory\" is held by bob with token %d.\n",
		old, leader, nodes[leader].Status().Term, time.Since(start).Round(time.Millisecond), info.Token)

	lc, err := carol.Acquire(ctx, "reports")
	if err != nil {
		return err
	}
	if lc.Token() <= lb.Token() {
		return fmt.Errorf("carol's token %d is not above bob's %d", lc.Token(), lb.Token())
	}
	fmt.Printf("8. carol acquired \"reports\" under the new leader: token %d, larger than every earlier grant.\n", lc.Token())

	// bob's replica dies: bob is told at once, and the cluster frees the
	// lock once bob's TTL has run out on the leader.
	bobReplica := followers[1]
	nodes[bobReplica].Close()
	delete(nodes, bobReplica)
	select {
	case <-lb.Lost():
	case <-time.After(time.Second):
		return errors.New("bob was not told he lost the lock")
	}
	fmt.Printf("9. Stopped bob's replica %d: bob's Lock.Lost() fired immediately; bob stops writing.\n", bobReplica)

	start = time.Now()
	lc2, err := carol.Acquire(ctx, "inventory")
	if err != nil {
		return err
	}
	waited := time.Since(start)
	if err := store.write("inventory", "carol was here", lc2.Token()); err != nil {
		return err
	}
	fmt.Printf("10. carol waited %v (bob's TTL is %v) and got \"inventory\" with token %d; her write is accepted.\n",
		waited.Round(time.Millisecond), ttl, lc2.Token())

	err = store.write("inventory", "bob, paused and late", lb.Token())
	if !errors.Is(err, quorumlock.ErrStaleToken) {
		return fmt.Errorf("bob's stale write: want ErrStaleToken, got %v", err)
	}
	fmt.Printf("11. bob's late write with token %d is rejected: the fence protects the store even from a paused holder.\n", lb.Token())

	if err := carol.Close(ctx); err != nil {
		return err
	}
	if err := alice.Close(ctx); err != nil {
		return err
	}
	for _, name := range []string{"inventory", "reports"} {
		info, err := nodes[leader].Holder(ctx, name)
		if err != nil {
			return err
		}
		if info.Holder != 0 {
			return fmt.Errorf("after the sessions closed, %q is held: %+v", name, info)
		}
	}
	fmt.Println("12. Closed the sessions; their locks are free. Done.")
	return nil
}

// waitLeader waits until every running replica names the same running
// leader.
func waitLeader(ctx context.Context, nodes map[uint64]*quorumlock.Node) (uint64, error) {
	for {
		var leader uint64
		agree := true
		for _, n := range nodes {
			l := n.Status().Leader
			if leader == 0 {
				leader = l
			}
			if l == 0 || l != leader {
				agree = false
			}
		}
		if agree && nodes[leader] != nil {
			return leader, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no leader: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitWaiting waits until session is in the queue of name.
func waitWaiting(ctx context.Context, n *quorumlock.Node, name string, session uint64) error {
	for {
		info, err := n.Holder(ctx, name)
		if err != nil {
			return err
		}
		for _, w := range info.Waiters {
			if w == session {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
