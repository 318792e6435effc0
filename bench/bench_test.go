package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
)

// The public path on a real 3-replica cluster on loopback (fsync on). Only
// benchmarks live here, so `go test ./...` runs none of them (the tests of
// this package, in the other files, are quick and start no cluster).
//
//	go test -run '^$' -bench . ./bench

func benchCluster(b *testing.B) (*qlCluster, int) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := startQL(ctx, 3, b.TempDir(), "")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	leader, err := c.Leader(ctx)
	if err != nil {
		b.Fatal(err)
	}
	return c, leader
}

func acquireRelease(b *testing.B, s *quorumlock.Session, name string) {
	ctx := context.Background()
	for b.Loop() {
		l, err := s.Acquire(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquireRelease: one session on the leader's replica (requests
// in process); one op is an acquire and a release, two log entries.
func BenchmarkAcquireRelease(b *testing.B) {
	c, leader := benchCluster(b)
	s, err := c.nodes[leader].NewSession(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	acquireRelease(b, s, "bench")
}

// BenchmarkAcquireReleaseFollower: the same through a follower (requests
// forwarded to the leader over gRPC).
func BenchmarkAcquireReleaseFollower(b *testing.B) {
	c, leader := benchCluster(b)
	s, err := c.nodes[c.followers(leader)[0]].NewSession(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	acquireRelease(b, s, "bench")
}

// BenchmarkAcquireReleaseParallel: GOMAXPROCS x -cpu goroutines (try
// -cpu 32), each with its own session and name, spread over the replicas.
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	c, _ := benchCluster(b)
	b.ResetTimer() // not the cluster's start and first election
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		i := int(next.Add(1))
		s, err := c.nodes[i%3].NewSession(ctx)
		if err != nil {
			b.Error(err)
			return
		}
		name := fmt.Sprintf("bench/%d", i)
		for pb.Next() {
			l, err := s.Acquire(ctx, name)
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
