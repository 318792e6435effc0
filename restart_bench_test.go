package quorumlock

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/storage"
	"github.com/quorumlock/quorumlock/storage/pebblestore"
)

// BenchmarkRestart1M measures restarts with 1,000,000 locks over 100,000
// sessions in the replicas' latest snapshot: replica-restart-s is one
// replica restarting while the other two serve, from Start to a
// linearizable read answered by it (DESIGN.md: within 5 s);
// cluster-restart-s is all three started one after another in this process
// until a read and a new grant succeed. The data directories are written
// directly with the lock table's snapshot, as a replica would have left
// them. Run it with -benchtime=1x.
func BenchmarkRestart1M(b *testing.B) {
	const sessions, perSession = 100_000, 10
	m := fsm.New(fsm.Limits{})
	index := uint64(0)
	for range sessions {
		index++
		m.Apply(index, 1, &fsm.Command{Op: fsm.OpOpenSession, TTL: int64(10 * time.Minute)})
	}
	for s := uint64(1); s <= sessions; s++ {
		for i := range uint64(perSession) {
			index++
			m.Apply(index, 1, &fsm.Command{Op: fsm.OpAcquire, Session: s, Seq: i + 1, Done: i + 1, Name: fmt.Sprintf("lock-%d-%d", s, i)})
		}
	}
	var img bytes.Buffer
	if _, err := m.Snapshot().WriteTo(&img); err != nil {
		b.Fatal(err)
	}
	probe := m.Holder("lock-77-7")
	b.StopTimer()
	for range b.N {
		base := b.TempDir()
		peers := map[uint64]string{}
		lis := map[uint64]net.Listener{}
		for id := uint64(1); id <= 3; id++ {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			lis[id], peers[id] = l, l.Addr().String()
		}
		cfgs := map[uint64]Config{}
		for id := uint64(1); id <= 3; id++ {
			cfg := Config{ID: id, Peers: peers, DataDir: filepath.Join(base, fmt.Sprint(id)), Listener: lis[id],
				TickInterval: 20 * time.Millisecond}
			cfg = cfg.withDefaults()
			st, err := pebblestore.Open(filepath.Join(cfg.DataDir, "log"), pebblestore.Options{})
			if err != nil {
				b.Fatal(err)
			}
			must := func(err error) {
				if err != nil {
					b.Fatal(err)
				}
			}
			must(st.SetIdentity(storage.Identity{ClusterID: cfg.clusterID(), MemberID: id}))
			must(st.SaveSnapshot(&raftpb.Snapshot{Data: img.Bytes(), Metadata: &raftpb.SnapshotMetadata{
				Index: new(index), Term: new(uint64(1)), ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}},
			}}))
			must(st.Save(&raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(0)), Commit: new(index)}, nil))
			must(st.Close())
			cfgs[id] = cfg
		}
		b.StartTimer()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		nodes := map[uint64]*Node{}
		for id := uint64(1); id <= 3; id++ {
			n, err := Start(ctx, cfgs[id])
			if err != nil {
				b.Fatal(err)
			}
			nodes[id] = n
		}
		info, err := nodes[1].Holder(ctx, "lock-77-7")
		if err != nil || info.Holder != probe.Holder || uint64(info.Token) != probe.Token {
			b.Fatalf("after restart: %+v %v, want %+v", info, err, probe)
		}
		s, err := nodes[2].NewSession(ctx)
		if err != nil {
			b.Fatal(err)
		}
		l, err := s.Acquire(ctx, "fresh")
		if err != nil || uint64(l.Token()) <= index {
			b.Fatalf("acquire after restart: %v %v", l, err)
		}
		cluster := time.Since(start)

		// One replica restarts while the other two serve.
		nodes[3].Close()
		lis3, err := net.Listen("tcp", peers[3])
		if err != nil {
			b.Fatal(err)
		}
		cfg3 := cfgs[3]
		cfg3.Listener = lis3
		start = time.Now()
		n3, err := Start(ctx, cfg3)
		if err != nil {
			b.Fatal(err)
		}
		nodes[3] = n3
		if info, err := n3.Holder(ctx, "fresh"); err != nil || info.Token != l.Token() {
			b.Fatalf("restarted replica: %+v %v", info, err)
		}
		replica := time.Since(start)
		b.StopTimer()
		b.ReportMetric(cluster.Seconds(), "cluster-restart-s")
		b.ReportMetric(replica.Seconds(), "replica-restart-s")
		b.ReportMetric(float64(img.Len())/(1<<20), "snapshot-MiB")
		cancel()
		for _, n := range nodes {
			n.Close()
		}
	}
}
