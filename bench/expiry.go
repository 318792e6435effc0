package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quorumlock/quorumlock"
)

// ExpiryStorm opens p.stormSessions sessions (TTL p.stormTTL) through one
// follower, each holding one lock, then closes that follower: every session
// stops heartbeating at once (Close sends no session close). It reports the
// time from the moment the last session's TTL has passed on the leader
// until every lock is seen free by linearizable Holder reads on the leader.
func (qlSystem) ExpiryStorm(ctx context.Context, p *params) (measure, error) {
	dir, err := os.MkdirTemp(p.dir, "ours-")
	if err != nil {
		return measure{}, err
	}
	defer os.RemoveAll(dir)
	c, err := startQL(ctx, 3, dir)
	if err != nil {
		return measure{}, err
	}
	defer c.Close()
	leader, err := c.Leader(ctx)
	if err != nil {
		return measure{}, err
	}
	f := c.followers(leader)[0]
	ss, err := c.openSessions(ctx, p.stormSessions, []int{f}, quorumlock.WithTTL(p.stormTTL))
	if err != nil {
		return measure{}, err
	}
	names := make([]string, len(ss))
	pr := newProgress("acquire locks", len(ss))
	err = parallel(ctx, len(ss), 256, func(ctx context.Context, i int) error {
		names[i] = fmt.Sprintf("e/%d", i)
		_, err := ss[i].Acquire(ctx, names[i])
		pr.add(1)
		return err
	})
	pr.finish()
	if err != nil {
		return measure{}, err
	}

	// Close right after a heartbeat wave, so that no heartbeat is in
	// flight: otherwise the leader may have renewed sessions whose
	// acknowledgement the client never saw, and the moment their TTL passes
	// would be unknown by up to TTL/3.
	quiet := waitHeartbeatLull(ctx, ss, p.stormTTL)
	tClose := time.Now()
	p.prof.start()
	defer p.prof.stop()
	if err := c.Stop(f); err != nil {
		return measure{}, err
	}
	closeDur := time.Since(tClose)
	// The leader expires a session a TTL after the last heartbeat it
	// received. The client knows the send time of its last acknowledged
	// one (Deadline = send time + TTL - TTL/10), so the last TTL to pass
	// does so at the latest Deadline + TTL/10 (a heartbeat in flight at the
	// close could only make it later, and the measure larger).
	var last time.Time
	for _, s := range ss {
		if d := s.Deadline(); d.After(last) {
			last = d
		}
	}
	t0 := last.Add(p.stormTTL / 10)
	lead := c.nodes[leader]
	sleepUntil(ctx, tClose.Add(p.stormTTL/2))

	deadline := t0.Add(p.stormMaxWait)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var (
		mu       sync.Mutex
		lastFree time.Time
		rounds   int
		reads    int
	)
	remaining := names
	for len(remaining) > 0 && dctx.Err() == nil {
		rounds++
		reads += len(remaining)
		held := make([]bool, len(remaining))
		err := parallel(dctx, len(remaining), 64, func(ctx context.Context, i int) error {
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			defer rcancel()
			info, err := lead.Holder(rctx, remaining[i])
			if err != nil {
				return err
			}
			if info.Holder != 0 {
				held[i] = true
				return nil
			}
			now := time.Now()
			mu.Lock()
			if now.After(lastFree) {
				lastFree = now
			}
			mu.Unlock()
			return nil
		})
		if err != nil && dctx.Err() == nil {
			return measure{}, fmt.Errorf("holder read: %w", err)
		}
		var next []string
		for i, h := range held {
			if h {
				next = append(next, remaining[i])
			}
		}
		remaining = next
		if len(remaining) > 0 && len(remaining) < 100 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	m := measure{extra: map[string]any{
		"sessions":                      len(ss),
		"ttl_s":                         p.stormTTL.Seconds(),
		"replica_close_s":               closeDur.Seconds(),
		"all_free_after_close_s":        lastFree.Sub(tClose).Seconds(),
		"after_close_plus_ttl_s":        lastFree.Sub(tClose.Add(p.stormTTL)).Seconds(),
		"last_ttl_passed_after_close_s": t0.Sub(tClose).Seconds(),
		"holder_reads":                  reads,
		"closed_in_heartbeat_lull":      quiet,
		"poll_rounds":                   rounds,
		"measured_from":                 "the latest acknowledged heartbeat's send time + TTL",
		"sessions_opened_through":       "one follower, which is then closed",
	}}
	if len(remaining) > 0 {
		m.extra["still_held_at_deadline"] = len(remaining)
		m.extra["incomplete"] = true
		m.value = deadline.Sub(t0).Seconds()
		return m, nil
	}
	m.value = lastFree.Sub(t0).Seconds()
	return m, nil
}

// ExpiryStorm grants p.etcdStormSessions leases (TTL p.stormTTL) through a
// client of the leader, keeps them alive, attaches one Mutex key to each,
// then closes that client: the keepalives stop at once. It reports the time
// from the moment the last lease's TTL has passed until no key is left (a
// count-only range read on the leader every 50 ms).
func (etcdSystem) ExpiryStorm(ctx context.Context, p *params) (measure, error) {
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
	// etcd's best case: the client talks to the leader directly (through a
	// follower, every keepalive would be forwarded as an HTTP request).
	cf, err := c.newClient(leader)
	if err != nil {
		return measure{}, err
	}
	defer cf.Close()
	ttl := int64(p.stormTTL / time.Second)
	ids, err := grantLeases(ctx, cf.Ctx(), []*clientv3.Client{cf}, p.etcdStormSessions, ttl)
	if err != nil {
		return measure{}, err
	}
	pr := newProgress("lock keys", len(ids))
	err = parallel(ctx, len(ids), 256, func(ctx context.Context, i int) error {
		_, err := cf.Put(ctx, mutexKey(fmt.Sprintf("/bench/e/%d", i), ids[i]), "", clientv3.WithLease(ids[i]))
		pr.add(1)
		return err
	})
	pr.finish()
	if err != nil {
		return measure{}, err
	}

	tClose := time.Now()
	cf.Close()
	closeDur := time.Since(tClose)
	// The leader renews a lease just before it answers the keepalive, so
	// the last lease's TTL passes at the latest last answer + TTL.
	t0 := time.Unix(0, c.lastKeepAlive.Load()).Add(p.stormTTL)
	sleepUntil(ctx, tClose.Add(p.stormTTL/2))
	deadline := t0.Add(p.stormMaxWait)
	cl := c.clients[leader]
	var left int64 = -1
	var tFree time.Time
	for time.Now().Before(deadline) && ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := cl.Get(rctx, "/bench/e/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if err != nil {
			return measure{}, err
		}
		if left = r.Count; left == 0 {
			tFree = time.Now()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	m := measure{extra: map[string]any{
		"sessions":                      len(ids),
		"ttl_s":                         p.stormTTL.Seconds(),
		"client_close_s":                closeDur.Seconds(),
		"measured_from":                 "the last keepalive answer + TTL",
		"after_close_plus_ttl_s":        0.0,
		"last_ttl_passed_after_close_s": t0.Sub(tClose).Seconds(),
		"sessions_opened_through":       "one client pinned to a follower, which is then closed",
		"note":                          "etcd's lessor revokes at most 1,000 expired leases per second (a constant in lease/lessor.go)",
	}}
	if left != 0 {
		m.extra["still_held_at_deadline"] = left
		m.extra["incomplete"] = true
		m.value = deadline.Sub(t0).Seconds()
		return m, nil
	}
	m.extra["all_free_after_close_s"] = tFree.Sub(tClose).Seconds()
	m.extra["after_close_plus_ttl_s"] = tFree.Sub(tClose.Add(p.stormTTL)).Seconds()
	m.value = tFree.Sub(t0).Seconds()
	return m, nil
}

// waitHeartbeatLull waits until every session has had a heartbeat
// acknowledged since the call and then no acknowledgement has come for
// 300 ms, a gap between heartbeat waves. It gives up after a TTL and
// reports whether it found one.
func waitHeartbeatLull(ctx context.Context, ss []*quorumlock.Session, ttl time.Duration) bool {
	const lull = 300 * time.Millisecond
	ref := make([]time.Time, len(ss))
	for i, s := range ss {
		ref[i] = s.Deadline()
	}
	renewed := make([]bool, len(ss))
	left := len(ss)
	lastChange := time.Now()
	end := time.Now().Add(ttl)
	for time.Now().Before(end) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		for i, s := range ss {
			if d := s.Deadline(); !d.Equal(ref[i]) {
				ref[i], lastChange = d, time.Now()
				if !renewed[i] {
					renewed[i] = true
					left--
				}
			}
		}
		if left == 0 && time.Since(lastChange) >= lull {
			return true
		}
	}
	return false
}
