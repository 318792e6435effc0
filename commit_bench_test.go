package quorumlock_test

import (
	"slices"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// BenchmarkCommitLatency measures end-to-end commit latency on each log
// backend in the same run: one client on the leader's replica acquires
// (one committed entry) and releases (another), 3 replicas, fsync on.
// Reports the p50 and p99 of the acquire.
func BenchmarkCommitLatency(b *testing.B) {
	for _, backend := range []quorumlock.LogBackend{quorumlock.LogPebble, quorumlock.LogWAL} {
		b.Run(string(backend), func(b *testing.B) {
			c := testcluster.New(b, testcluster.Options{Size: 3, Configure: func(cfg *quorumlock.Config) {
				cfg.LogBackend = backend
			}})
			lead := c.WaitLeader(5 * time.Second)
			ctx := b.Context()
			s, err := c.Node(lead).NewSession(ctx, quorumlock.WithTTL(time.Minute))
			if err != nil {
				b.Fatal(err)
			}
			var lat []time.Duration
			for b.Loop() {
				start := time.Now()
				l, err := s.Acquire(ctx, "bench")
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
