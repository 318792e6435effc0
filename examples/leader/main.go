// Command leader shows leader election with quorumlock: three replicas each
// campaign for the role "scheduler"; the leader does fenced work on a shared
// resource with its epoch; the leader's replica is stopped; another replica
// takes over with a larger epoch, and a late write from the old leader is
// rejected by the resource. It prints a narrative and exits 0.
//
//	go run ./examples/leader
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/quorumlock/quorumlock"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "leader example failed:", err)
		os.Exit(1)
	}
}

// jobLog is the downstream system: it accepts work only from the newest
// leader it has seen, judged by epoch.
type jobLog struct {
	mu    sync.Mutex
	fence *quorumlock.Fence
	lines []string
}

func (j *jobLog) append(epoch quorumlock.Token, line string) error {
	if err := j.fence.Admit("jobs", epoch); err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.lines = append(j.lines, line)
	return nil
}

func run() error {
	// Interrupted, the example stops where it is and still closes the
	// replicas and removes their data; a second signal kills it.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "quorumlock-leader-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	peers := map[uint64]string{}
	lis := map[uint64]net.Listener{}
	for id := uint64(1); id <= 3; id++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		lis[id], peers[id] = l, l.Addr().String()
	}
	nodes := map[uint64]*quorumlock.Node{}
	defer func() {
		for _, n := range nodes {
			n.Close()
		}
	}()
	for id := uint64(1); id <= 3; id++ {
		n, err := quorumlock.Start(ctx, quorumlock.Config{
			ID: id, Peers: peers, DataDir: filepath.Join(dir, fmt.Sprint(id)), Listener: lis[id],
			SessionTTL: 3 * time.Second, TickInterval: 50 * time.Millisecond, ElectionTicks: 10,
		})
		if err != nil {
			return err
		}
		nodes[id] = n
	}
	fmt.Println("Started 3 replicas; each one campaigns for the role \"scheduler\".")

	jobs := &jobLog{fence: quorumlock.NewFence()}
	type win struct {
		id uint64
		ld *quorumlock.Leadership
	}
	wins := make(chan win, 3)
	for id, n := range nodes {
		go func() {
			ld, err := n.Elect(ctx, "scheduler", []byte(fmt.Sprintf("replica-%d", id)))
			if err == nil {
				wins <- win{id, ld}
			}
		}()
	}
	// A campaign that fails (ctx ended) sends nothing: wait for ctx too.
	next := func() (win, error) {
		select {
		case w := <-wins:
			return w, nil
		case <-ctx.Done():
			return win{}, fmt.Errorf("no leader elected: %w", ctx.Err())
		}
	}
	first, err := next()
	if err != nil {
		return err
	}
	info, err := nodes[first.id].Leader(ctx, "scheduler")
	if err != nil {
		return err
	}
	fmt.Printf("Replica %d leads with epoch %d (Leader() says %q, epoch %d); the others wait in line.\n",
		first.id, first.ld.Epoch(), info.Value, info.Epoch)

	for i := 1; i <= 3; i++ {
		if err := jobs.append(first.ld.Epoch(), fmt.Sprintf("run %d by replica %d", i, first.id)); err != nil {
			return err
		}
	}
	fmt.Printf("The leader schedules 3 jobs, each written to the job log with its epoch %d.\n", first.ld.Epoch())

	// The leader's replica goes down.
	start := time.Now()
	nodes[first.id].Close()
	delete(nodes, first.id)
	select {
	case <-first.ld.Context().Done():
	case <-time.After(time.Second):
		return errors.New("the old leader's Context was not cancelled when its replica stopped")
	}
	fmt.Printf("Stopped replica %d: its leadership's Context is cancelled at once, so its work stops.\n", first.id)

	second, err := next()
	if err != nil {
		return err
	}
	fmt.Printf("Replica %d is the new leader with epoch %d (> %d), %v after the stop (the old session had to expire).\n",
		second.id, second.ld.Epoch(), first.ld.Epoch(), time.Since(start).Round(time.Millisecond))
	if second.ld.Epoch() <= first.ld.Epoch() {
		return fmt.Errorf("epoch did not grow")
	}
	if err := jobs.append(second.ld.Epoch(), fmt.Sprintf("run 4 by replica %d", second.id)); err != nil {
		return err
	}

	err = jobs.append(first.ld.Epoch(), "run 5 by the old leader, waking up late")
	if !errors.Is(err, quorumlock.ErrStaleToken) {
		return fmt.Errorf("late write from the old leader: want ErrStaleToken, got %v", err)
	}
	fmt.Printf("A late write from the old leader (epoch %d) is rejected: %v\n", first.ld.Epoch(), err)

	if err := second.ld.Resign(ctx); err != nil {
		return err
	}
	third, err := next()
	if err != nil {
		return err
	}
	fmt.Printf("Replica %d resigns; replica %d takes over with epoch %d.\n", second.id, third.id, third.ld.Epoch())
	if err := third.ld.Resign(ctx); err != nil {
		return err
	}
	fmt.Printf("Job log: %q\n", jobs.lines)
	return nil
}
