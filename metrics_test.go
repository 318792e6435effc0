package quorumlock_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// metricValue sums the samples of family name whose labels include want.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) (float64, bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	sum, found := 0.0, false
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue metrics
				}
			}
			found = true
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				sum += m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				sum += m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum, found
}

func member(id uint64) map[string]string {
	return map[string]string{"member": strconv.FormatUint(id, 10)}
}

// TestMetrics: three replicas share one registry (Config.Metrics); the
// metrics tell which one leads, count the requests, heartbeats and log
// writes the cluster served, and show the lock table; registering the same
// member twice fails Start with ErrInvalidConfig; Close unregisters a
// replica's metrics.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := testcluster.New(t, testcluster.Options{Configure: func(cfg *quorumlock.Config) { cfg.Metrics = reg }})
	lead := c.WaitLeader(10 * time.Second)
	var follower uint64
	for _, id := range c.IDs() {
		if id != lead {
			follower = id
			break
		}
	}
	s := newSession(t, c.Node(follower))
	l := mustAcquire(t, s, "m")
	if err := l.Release(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, "m")

	if v, _ := metricValue(t, reg, "quorumlock_raft_leader", nil); v != 1 {
		t.Errorf("quorumlock_raft_leader sums to %v over the replicas, want 1", v)
	}
	if v, _ := metricValue(t, reg, "quorumlock_raft_leader", member(lead)); v != 1 {
		t.Errorf("quorumlock_raft_leader of the leader %d = %v", lead, v)
	}
	if v, _ := metricValue(t, reg, "quorumlock_requests_total", map[string]string{"member": strconv.FormatUint(lead, 10), "op": "acquire", "code": "ok"}); v != 2 {
		t.Errorf("acquires answered ok by the leader = %v, want 2", v)
	}
	if v, _ := metricValue(t, reg, "quorumlock_request_seconds", map[string]string{"member": strconv.FormatUint(lead, 10), "op": "release"}); v != 1 {
		t.Errorf("release latency samples at the leader = %v, want 1", v)
	}
	if v, _ := metricValue(t, reg, "quorumlock_sessions", member(lead)); v != 1 {
		t.Errorf("sessions on the leader = %v, want 1", v)
	}
	if v, _ := metricValue(t, reg, "quorumlock_locks_held", member(lead)); v != 1 {
		t.Errorf("locks held on the leader = %v, want 1", v)
	}
	// Every replica has written the five entries (the leader's empty one,
	// the session, acquire, release, acquire) once it applied them; a
	// follower outside the commit quorum may still be behind.
	commit := c.Node(lead).Status().Commit
	for wait := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		behind := false
		for _, id := range c.IDs() {
			behind = behind || c.Node(id).Status().Applied < commit
		}
		if !behind {
			break
		}
		if time.Now().After(wait) {
			t.Fatalf("replicas did not apply through %d", commit)
		}
	}
	for _, id := range c.IDs() {
		if v, _ := metricValue(t, reg, "quorumlock_log_saved_entries_total", member(id)); v < 5 {
			t.Errorf("replica %d wrote %v log entries, want at least 5", id, v)
		}
		if v, _ := metricValue(t, reg, "quorumlock_raft_term", member(id)); v < 2 {
			t.Errorf("replica %d: term %v", id, v)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if v, _ := metricValue(t, reg, "quorumlock_heartbeats_total", map[string]string{"member": strconv.FormatUint(lead, 10), "result": "alive"}); v >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no heartbeat counted at the leader")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The same member again, in the same registry.
	cfg := c.Config(lead)
	cfg.DataDir = t.TempDir()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	cfg.Listener = lis
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if n, err := quorumlock.Start(ctx, cfg); !errors.Is(err, quorumlock.ErrInvalidConfig) {
		if n != nil {
			n.Close()
		}
		t.Fatalf("Start of a second member %d in the same registry: %v, want ErrInvalidConfig", lead, err)
	}
	if v, _ := metricValue(t, reg, "quorumlock_raft_leader", member(lead)); v != 1 {
		t.Errorf("after the refused Start, the leader's metrics read %v", v)
	}

	c.Stop(follower)
	if _, found := metricValue(t, reg, "quorumlock_raft_term", member(follower)); found {
		t.Errorf("replica %d's metrics are still registered after Close", follower)
	}
}
