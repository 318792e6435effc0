package service

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/clock"
	"github.com/quorumlock/quorumlock/internal/fsm"
)

// BenchmarkApplyWithWatchers applies an acquire and a release of one lock
// per iteration while other locks are observed: the apply path should not
// pay per observed name for an entry that names another lock.
func BenchmarkApplyWithWatchers(b *testing.B) {
	for _, watched := range []int{0, 20_000} {
		b.Run(fmt.Sprintf("watched=%d", watched), func(b *testing.B) {
			clk := clock.NewManual(time.Unix(1000, 0))
			svc := New(Config{Clock: clk, Limits: fsm.Limits{MinTTL: int64(time.Second), MaxTTL: int64(time.Hour)}})
			svc.Bind(&fakeRaft{svc: svc, term: 2, leader: 1, changed: make(chan struct{})})
			index := uint64(0)
			entry := func(cmd fsm.Command) *raftpb.Entry {
				index++
				return &raftpb.Entry{Index: new(index), Term: new(uint64(3)), Type: raftpb.EntryNormal.Enum(), Data: fsm.Encode(&cmd)}
			}
			svc.Apply([]*raftpb.Entry{{Index: new(uint64(1)), Term: new(uint64(3)), Type: raftpb.EntryNormal.Enum()}})
			index = 1
			svc.LeaderReady(3)
			svc.Apply([]*raftpb.Entry{entry(fsm.Command{Op: fsm.OpOpenSession, TTL: int64(time.Hour), Nonce: 1})})
			session := index
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for i := range watched {
				<-svc.Watch(ctx, fmt.Sprint("watched-", i)) // the initial state
			}
			seq := uint64(0)
			b.ResetTimer()
			for range b.N {
				seq++
				acq := entry(fsm.Command{Op: fsm.OpAcquire, Session: session, Seq: seq, Done: seq, Name: "k"})
				seq++
				rel := entry(fsm.Command{Op: fsm.OpRelease, Session: session, Seq: seq, Done: seq, Name: "k", Token: index})
				svc.Apply([]*raftpb.Entry{acq, rel})
			}
		})
	}
}
