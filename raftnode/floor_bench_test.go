package raftnode_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"

	"github.com/quorumlock/quorumlock/raftnode"
	"github.com/quorumlock/quorumlock/storage/pebblestore"
	"github.com/quorumlock/quorumlock/transport"
)

// BenchmarkCommitFloor measures what the consensus layer alone can commit,
// the ceiling under everything quorumlock adds (the lock table, sessions,
// forwarding, the client API): three raftnode replicas on Pebble logs
// (fsync on, in b.TempDir), a state machine that only wakes the proposer,
// and 64 or 256 proposers on the leader, each proposing an 8-byte entry
// and waiting for its apply before proposing the next. Peers talk either
// "direct" (Transport.Send steps the destination node in-process: no
// network, no copy, no goroutine) or over "grpc" (the transport package
// on loopback, as a replica does).
//
// The uncontended_N scenarios of `go run ./bench` make two entries per
// cycle with N clients, one request in flight each, so their cycles/s
// cannot exceed half the commits/s reported here for N proposers.
// Metrics: commits/s, process CPU per commit (µs, all three replicas and
// the proposers) and the proposers' p50 wait from propose to apply (ms).
//
//	go test -run '^$' -bench CommitFloor -benchtime 100000x ./raftnode
func BenchmarkCommitFloor(b *testing.B) {
	for _, grpcPeers := range []bool{false, true} {
		for _, proposers := range []int{64, 256} {
			name := "direct"
			if grpcPeers {
				name = "grpc"
			}
			b.Run(fmt.Sprintf("%s/proposers=%d", name, proposers), func(b *testing.B) {
				benchmarkCommitFloor(b, proposers, grpcPeers)
			})
		}
	}
}

// floorSM wakes the proposer of each applied entry.
type floorSM struct {
	mu      sync.Mutex
	waiters map[uint64]chan struct{}
	applied atomic.Uint64
}

func (s *floorSM) Apply(ents []*raftpb.Entry) {
	s.mu.Lock()
	for _, e := range ents {
		if d := e.GetData(); len(d) == 8 {
			id := binary.BigEndian.Uint64(d)
			if c, ok := s.waiters[id]; ok {
				delete(s.waiters, id)
				close(c)
			}
		}
	}
	s.mu.Unlock()
	s.applied.Store(ents[len(ents)-1].GetIndex())
}

func (s *floorSM) wait(id uint64) chan struct{} {
	c := make(chan struct{})
	s.mu.Lock()
	s.waiters[id] = c
	s.mu.Unlock()
	return c
}

func (s *floorSM) LeaderReady(uint64) {}
func (s *floorSM) LeaderLost()        {}
func (s *floorSM) Snapshot() (uint64, func(io.Writer) error) {
	return s.applied.Load(), func(io.Writer) error { return nil }
}
func (s *floorSM) Restore(uint64, []byte) error { return nil }

// floorNet delivers each message by stepping the destination directly.
type floorNet struct{ nodes map[uint64]*raftnode.Node }

type floorTransport struct{ net *floorNet }

func (t floorTransport) Send(msgs []*raftpb.Message) {
	for _, m := range msgs {
		if n := t.net.nodes[m.GetTo()]; n != nil {
			n.Step(m)
		}
	}
}

func benchmarkCommitFloor(b *testing.B, proposers int, grpcPeers bool) {
	ids := []uint64{1, 2, 3}
	direct := &floorNet{nodes: make(map[uint64]*raftnode.Node)}
	trans := make(map[uint64]raftnode.Transport)
	if grpcPeers {
		lis := make(map[uint64]net.Listener)
		addrs := make(map[uint64]string)
		for _, id := range ids {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			lis[id], addrs[id] = l, l.Addr().String()
		}
		for _, id := range ids {
			t, err := transport.New(transport.Config{
				ClusterID: 1,
				ID:        id,
				Peers:     addrs,
				Handler: func(m *raftpb.Message) {
					if n := direct.nodes[id]; n != nil {
						n.Step(m)
					}
				},
			})
			if err != nil {
				b.Fatal(err)
			}
			srv := grpc.NewServer()
			t.Register(srv)
			go func() { _ = srv.Serve(lis[id]) }()
			b.Cleanup(func() {
				_ = t.Close()
				srv.Stop()
			})
			trans[id] = t
		}
	} else {
		for _, id := range ids {
			trans[id] = floorTransport{direct}
		}
	}
	sms := make(map[uint64]*floorSM)
	for _, id := range ids {
		st, err := pebblestore.Open(b.TempDir(), pebblestore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = st.Close() })
		sms[id] = &floorSM{waiters: make(map[uint64]chan struct{})}
		n, err := raftnode.New(raftnode.Config{
			ID:            id,
			Peers:         ids,
			Storage:       st,
			Transport:     trans[id],
			StateMachine:  sms[id],
			TickInterval:  10 * time.Millisecond,
			ElectionTicks: 10,
		})
		if err != nil {
			b.Fatal(err)
		}
		direct.nodes[id] = n
	}
	for _, n := range direct.nodes {
		n.Start()
	}
	b.Cleanup(func() {
		for _, n := range direct.nodes {
			n.Stop()
		}
	})
	var leader *raftnode.Node
	var sm *floorSM
	for deadline := time.Now().Add(10 * time.Second); leader == nil; {
		for id, n := range direct.nodes {
			if n.Status().State == raft.StateLeader {
				leader, sm = n, sms[id]
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("no leader within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}

	ctx := context.Background()
	var next atomic.Uint64
	var wg sync.WaitGroup
	lat := make([][]time.Duration, proposers)
	errs := make(chan error, proposers)
	b.ResetTimer()
	start, cpu0 := time.Now(), processCPU()
	for p := range proposers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var data [8]byte
			for {
				id := next.Add(1)
				if id > uint64(b.N) {
					return
				}
				binary.BigEndian.PutUint64(data[:], id)
				c := sm.wait(id)
				t := time.Now()
				if err := leader.ProposeAsync(ctx, raftnode.AsyncProposal{Data: append([]byte(nil), data[:]...)}); err != nil {
					errs <- err
					return
				}
				select {
				case <-c:
				case <-time.After(10 * time.Second):
					errs <- fmt.Errorf("entry %d not applied within 10s", id)
					return
				}
				lat[p] = append(lat[p], time.Since(t))
			}
		}()
	}
	wg.Wait()
	elapsed, cpu := time.Since(start), processCPU()-cpu0
	b.StopTimer()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "commits/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/commit")
	if len(all) > 0 {
		slices.Sort(all)
		b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
	}
}

// processCPU is the user and system CPU time of the process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
