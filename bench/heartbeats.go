package main

import (
	"context"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quorumlock/quorumlock"
)

// Heartbeats opens p.hbSessions sessions spread over the three replicas
// (a third in process on the leader, two thirds over the followers' gRPC
// heartbeat streams) and, while nothing but heartbeats flows, counts the
// acknowledged heartbeats (every change of a session's lease deadline is
// one), the process CPU they cost, and the log entries added.
func (s qlSystem) Heartbeats(ctx context.Context, p *params) (measure, error) {
	dir, err := os.MkdirTemp(p.dir, "ours-")
	if err != nil {
		return measure{}, err
	}
	defer os.RemoveAll(dir)
	c, err := startQL(ctx, 3, dir, s.backend)
	if err != nil {
		return measure{}, err
	}
	defer c.Close()
	leader, err := c.Leader(ctx)
	if err != nil {
		return measure{}, err
	}
	idleCPU := idleCPU(ctx, time.Second)
	ss, err := c.openSessions(ctx, p.hbSessions, c.all(), quorumlock.WithTTL(p.hbTTL))
	if err != nil {
		return measure{}, err
	}
	// Let every session reach its steady heartbeat rhythm.
	sleepUntil(ctx, time.Now().Add(p.hbTTL/3+500*time.Millisecond))

	last := make([]time.Time, len(ss))
	for i, s := range ss {
		last[i] = s.Deadline()
	}
	count, lost, leaderChanges := 0, 0, 0
	poll := func() {
		ended := 0
		for i, s := range ss {
			if d := s.Deadline(); !d.Equal(last[i]) {
				count++
				last[i] = d
			}
			if s.Err() != nil {
				ended++
			}
		}
		if ended > lost {
			logf("  %d sessions have ended (client lease ran out or expired on the cluster)", ended)
			lost = ended
		}
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		l, err := c.Leader(lctx)
		cancel()
		switch {
		case err != nil:
			logf("  no leader agreed within 3 s")
			leaderChanges++
		case l != leader:
			logf("  leader changed: replica %d -> %d", leader+1, l+1)
			leader = l
			leaderChanges++
		}
	}
	commit0, cpu0, t0 := c.commit(), cpuTime(), time.Now()
	p.prof.start()
	end := t0.Add(p.hbWindow)
	// Heartbeats come every TTL/3 per session; polling 4 times as often
	// sees every renewal.
	tick := time.NewTicker(p.hbTTL / 12)
	for time.Now().Before(end) && ctx.Err() == nil {
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
		poll()
	}
	tick.Stop()
	p.prof.stop()
	poll()
	window, cpu := time.Since(t0), cpuTime()-cpu0
	m := hbMeasure(count, window, cpu, idleCPU, c.commit()-commit0, len(ss), lost, p.hbTTL)
	m.extra["leader_changes"] = leaderChanges
	return m, nil
}

// commit returns the highest commit index any running replica knows.
func (c *qlCluster) commit() uint64 {
	var out uint64
	for _, n := range c.nodes {
		if n != nil {
			out = max(out, n.Status().Commit)
		}
	}
	return out
}

func hbMeasure(count int, window, cpu time.Duration, idle float64, entries uint64, sessions, lost int, ttl time.Duration) measure {
	m := measure{extra: map[string]any{
		"sessions":                sessions,
		"ttl_s":                   ttl.Seconds(),
		"offered_per_s":           float64(sessions) * 3 / ttl.Seconds(),
		"absorbed_per_s":          float64(count) / window.Seconds(),
		"heartbeats":              count,
		"window_s":                window.Seconds(),
		"process_cpu_s":           cpu.Seconds(),
		"process_cores_busy":      cpu.Seconds() / window.Seconds(),
		"idle_cluster_cores_busy": idle,
		"log_entries_added":       entries,
		"sessions_lost":           lost,
		"cpu_scope":               "whole process: leader, followers and every client heartbeater run in it",
	}}
	if count > 0 {
		m.extra["cpu_us_per_heartbeat"] = float64(cpu.Microseconds()) / float64(count)
	}
	if cpu > 0 {
		m.value = float64(count) / cpu.Seconds()
	}
	return m
}

// idleCPU returns the cores the process keeps busy with nothing to do but
// the running cluster (raft ticks, background work), over d.
func idleCPU(ctx context.Context, d time.Duration) float64 {
	c0, t0 := cpuTime(), time.Now()
	sleepUntil(ctx, t0.Add(d))
	return (cpuTime() - c0).Seconds() / time.Since(t0).Seconds()
}

// Heartbeats grants p.etcdHBSessions leases through a client pinned to the
// leader and keeps them alive with the client's KeepAlive; it counts successful keepalive responses (a stream
// interceptor), the process CPU and the raft entries the leader commits.
func (etcdSystem) Heartbeats(ctx context.Context, p *params) (measure, error) {
	dir, err := os.MkdirTemp(p.dir, "etcd-")
	if err != nil {
		return measure{}, err
	}
	defer os.RemoveAll(dir)
	c, err := startEtcd(ctx, 3, dir)
	if err != nil {
		return measure{}, err
	}
	defer c.Close()
	leader, err := c.Leader(ctx)
	if err != nil {
		return measure{}, err
	}
	idleCPU := idleCPU(ctx, time.Second)
	ttl := int64(p.hbTTL / time.Second)
	kctx, kcancel := context.WithCancel(ctx)
	defer kcancel()
	// etcd's best case: every lease is granted and kept alive through the
	// leader (a follower forwards each keepalive to the leader as an HTTP
	// request of its own).
	ids, err := grantLeases(ctx, kctx, []*clientv3.Client{c.clients[leader]}, p.etcdHBSessions, ttl)
	if err != nil {
		return measure{}, err
	}
	sleepUntil(ctx, time.Now().Add(p.hbTTL/3+500*time.Millisecond))

	srv := c.members[leader].Server
	commit0, n0, cpu0, t0 := srv.CommittedIndex(), c.keepAlives.Load(), cpuTime(), time.Now()
	sleepUntil(ctx, t0.Add(p.hbWindow))
	window, cpu, count := time.Since(t0), cpuTime()-cpu0, int(c.keepAlives.Load()-n0)
	changes := 0
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	if l, err := c.Leader(lctx); err != nil || l != leader {
		changes = 1
	}
	cancel()
	entries := srv.CommittedIndex() - commit0
	lost := etcdLostLeases(ctx, c.clients[leader], ids)
	m := hbMeasure(count, window, cpu, idleCPU, entries, len(ids), lost, p.hbTTL)
	m.extra["sessions_lost_sampled"] = true
	m.extra["leader_changes"] = changes
	return m, nil
}

// etcdLostLeases checks a sample of up to 1,000 leases and returns how many
// of all leases are estimated gone (-1 if the check failed).
func etcdLostLeases(ctx context.Context, cl *clientv3.Client, ids []clientv3.LeaseID) int {
	step := max(1, len(ids)/1000)
	checked, gone := 0, 0
	for i := 0; i < len(ids); i += step {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := cl.TimeToLive(cctx, ids[i])
		cancel()
		if err != nil {
			return -1
		}
		checked++
		if r.TTL <= 0 {
			gone++
		}
	}
	return gone * len(ids) / max(1, checked)
}
