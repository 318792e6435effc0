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
func (s qlSystem) ExpiryStorm(ctx context.Context, p *params) (measure, error) {
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
	deadline := t0.Add(p.stormMaxWait)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	// After the close nothing but expiries is logged (no other client is
	// left), so the moment the leader applies its last entry is the moment
	// every lock is free on it. Status is local: watching it every
	// millisecond costs the leader nothing, unlike reads.
	var (
		mu        sync.Mutex
		lastApply time.Time
		firstApp  time.Time
	)
	applied0 := lead.Status().Applied
	watchDone := make(chan struct{})
	stopWatch := make(chan struct{})
	go func() {
		defer close(watchDone)
		seen := applied0
		for {
			if a := lead.Status().Applied; a != seen {
				now := time.Now()
				mu.Lock()
				seen, lastApply = a, now
				if firstApp.IsZero() {
					firstApp = now
				}
				mu.Unlock()
			}
			select {
			case <-stopWatch:
				return
			case <-dctx.Done():
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	quietSince := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		if lastApply.After(t0) {
			return lastApply
		}
		return t0
	}
	// Every TTL has passed and nothing was applied for half a second.
	for dctx.Err() == nil && (time.Now().Before(t0) || time.Since(quietSince()) < 500*time.Millisecond) {
		time.Sleep(10 * time.Millisecond)
	}

	// Check every lock with linearizable reads on the leader; one still held
	// is read again until it is free (the watcher keeps timing the applies
	// that free it).
	rounds, reads := 0, 0
	remaining := names
	for len(remaining) > 0 && dctx.Err() == nil {
		rounds++
		reads += len(remaining)
		held := make([]bool, len(remaining))
		err := parallel(dctx, len(remaining), 64, func(ctx context.Context, i int) error {
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			defer rcancel()
			info, err := lead.Holder(rctx, remaining[i])
			held[i] = err == nil && info.Holder != 0
			return err
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
		if len(remaining) > 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(5 * time.Millisecond)
	close(stopWatch)
	<-watchDone
	mu.Lock()
	done, first := lastApply, firstApp
	mu.Unlock()
	st := lead.Status()
	m := measure{extra: map[string]any{
		"sessions":                      len(ss),
		"ttl_s":                         p.stormTTL.Seconds(),
		"replica_close_s":               closeDur.Seconds(),
		"last_ttl_passed_after_close_s": t0.Sub(tClose).Seconds(),
		"entries_applied_after_close":   st.Applied - applied0,
		"holder_reads":                  reads,
		"check_rounds":                  rounds,
		"closed_in_heartbeat_lull":      quiet,
		"measured_from":                 "the latest acknowledged heartbeat's send time + TTL",
		"measured_to":                   "the leader's last apply after the close (Status().Applied, watched every 1 ms); then every lock is checked free with Holder",
		"sessions_opened_through":       "one follower, which is then closed",
	}}
	if !first.IsZero() {
		m.extra["first_apply_after_close_s"] = first.Sub(tClose).Seconds()
	}
	if len(remaining) > 0 || done.IsZero() {
		m.extra["still_held_at_deadline"] = len(remaining)
		m.extra["incomplete"] = true
		m.value = deadline.Sub(t0).Seconds()
		return m, nil
	}
	m.extra["all_free_after_close_s"] = done.Sub(tClose).Seconds()
	m.extra["after_close_plus_ttl_s"] = done.Sub(tClose.Add(p.stormTTL)).Seconds()
	m.value = done.Sub(t0).Seconds()
	return m, nil
}

// ExpiryStorm grants p.etcdStormSessions leases (TTL p.stormTTL) through a
// client of the leader, keeps them alive, attaches one Mutex key to each,
// then closes that client: the keepalives stop at once. It reports the time
// from the moment the last lease's TTL has passed until no key is left (a
// count-only range read on the leader every 10 ms).
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
	slowReads := 0 // count reads that found no answer in 5 s
	for time.Now().Before(deadline) && ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := cl.Get(rctx, "/bench/e/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		timedOut := rctx.Err() != nil && ctx.Err() == nil
		cancel()
		if err != nil && timedOut {
			// A leader busy revoking may take longer than that to answer
			// (it did on 2026-12-02, 50,000 leases): ask again until the
			// deadline rather than lose the measurement.
			slowReads++
			continue
		}
		if err != nil {
			return measure{}, err
		}
		if left = r.Count; left == 0 {
			tFree = time.Now()
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	m := measure{extra: map[string]any{
		"sessions":                      len(ids),
		"ttl_s":                         p.stormTTL.Seconds(),
		"client_close_s":                closeDur.Seconds(),
		"measured_from":                 "the last keepalive answer + TTL",
		"after_close_plus_ttl_s":        0.0,
		"last_ttl_passed_after_close_s": t0.Sub(tClose).Seconds(),
		"sessions_opened_through":       "one client pinned to the leader, which is then closed",
		"note":                          "etcd's lessor revokes at most 1,000 expired leases per second (a constant in lease/lessor.go)",
		"count_reads_timed_out":         slowReads,
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

// waitHeartbeatLull waits for a moment when no heartbeat is in flight and
// none is due for 300 ms, and reports whether it found one within 2 TTLs.
// A session sends its next heartbeat TTL/3 after the send time of its last
// acknowledged one, and its Deadline is that send time + TTL - TTL/10, so
// the next send is Deadline - TTL + TTL/10 + TTL/3; a session whose
// heartbeat is in flight still shows the old Deadline, so its next send
// looks overdue.
func waitHeartbeatLull(ctx context.Context, ss []*quorumlock.Session, ttl time.Duration) bool {
	const lull = 300 * time.Millisecond
	back := ttl - ttl/10 - ttl/3
	end := time.Now().Add(2 * ttl)
	for time.Now().Before(end) && ctx.Err() == nil {
		var next time.Time
		for _, s := range ss {
			if n := s.Deadline().Add(-back); next.IsZero() || n.Before(next) {
				next = n
			}
		}
		if next.After(time.Now().Add(lull)) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}
