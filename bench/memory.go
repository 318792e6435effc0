package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quorumlock/quorumlock"
)

// Memory holds p.memLocks locks over p.memSessions sessions and reports the
// growth of the live Go heap of this process per (lock x replica). The
// sessions and their Lock handles live in a separate client process (this
// binary re-executed, see memClientCmd) that reaches the replicas over gRPC
// through quorumlock.Dial, so this process holds the three replicas and
// nothing of the clients: the delta is the lock service's memory. Sessions
// get the longest TTL so that heartbeats are rare.
func (s qlSystem) Memory(ctx context.Context, p *params) (measure, error) {
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
	hBase := stableHeap()
	partsBase := heapParts(qlReplicaParts)
	per := p.memLocks / p.memSessions
	mc, err := startMemClient(memClientConfig{
		addrs:    c.addrs(),
		sessions: p.memSessions,
		per:      per,
		ttl:      quorumlock.MaxSessionTTL,
		workers:  256,
	})
	if err != nil {
		return measure{}, err
	}
	defer mc.kill()
	f, err := mc.expect(ctx, "SESSIONS")
	if err != nil {
		return measure{}, err
	}
	ch, err := parseUints(f)
	if err != nil || len(ch) != 2 {
		return measure{}, fmt.Errorf("client process: malformed SESSIONS line %q", f)
	}
	h0 := stableHeap()
	rss0 := rssBytes()
	parts0 := heapParts(qlReplicaParts)
	p.prof.start()
	if err := mc.send("GO"); err != nil {
		return measure{}, fmt.Errorf("client process: %w", err)
	}
	f, err = mc.expect(ctx, "READY")
	p.prof.stop()
	if err != nil {
		return measure{}, err
	}
	if len(f) != 3 {
		return measure{}, fmt.Errorf("client process: malformed READY line %q", f)
	}
	rate, err1 := strconv.ParseFloat(f[0], 64)
	cl, err2 := parseUints(f[1:])
	if err1 != nil || err2 != nil {
		return measure{}, fmt.Errorf("client process: malformed READY line %q", f)
	}
	locks := int(cl[0])
	h1 := stableHeap()
	rss1 := rssBytes()
	parts := heapPartsDelta(parts0, heapParts(qlReplicaParts))
	p.prof.heap()
	// The locks were held throughout: the client fails if a session ended.
	if err := mc.stop(30 * time.Second); err != nil {
		return measure{}, fmt.Errorf("client process: %w", err)
	}
	m := memMeasure(hBase, h0, h1, parts, p.memSessions, locks, 3, rate)
	m.extra["rss_growth_bytes_per_lock_x_replica"] = (float64(rss1) - float64(rss0)) / float64(locks*3)
	m.extra["scope"] = "live Go heap of the bench process, which holds the 3 replicas only (sessions and Lock handles live in a child client process, over gRPC), divided by locks x replicas"
	sp := heapPartsDelta(partsBase, parts0)
	m.extra["replica_bytes_per_session_x_replica"] = sp["replica"] / float64(p.memSessions*3)
	// The client side, measured in the client process (its own live heap):
	// not part of the value.
	m.extra["client_bytes_per_lock"] = (float64(cl[1]) - float64(ch[1])) / float64(locks)
	m.extra["client_bytes_per_session"] = (float64(ch[1]) - float64(ch[0])) / float64(p.memSessions)
	m.extra["client_process_heap_with_locks_bytes"] = cl[1]
	return m, nil
}

func memMeasure(hBase, h0, h1 uint64, parts map[string]float64, sessions, locks, replicas int, rate float64) measure {
	m := measure{
		value: (float64(h1) - float64(h0)) / float64(locks*replicas),
		extra: map[string]any{
			"sessions":                 sessions,
			"locks":                    locks,
			"replicas":                 replicas,
			"heap_cluster_bytes":       hBase,
			"heap_with_sessions_bytes": h0,
			"heap_with_locks_bytes":    h1,
			"acquires_per_s":           rate,
			"scope":                    "live Go heap of the whole process (every member and client) divided by locks x replicas",
		},
	}
	// The split by allocation site (sampled heap profile).
	m.extra["replica_bytes_per_lock_x_replica"] = parts["replica"] / float64(locks*replicas)
	m.extra["client_bytes_per_lock"] = parts["client"] / float64(locks)
	m.extra["bench_bytes_per_lock"] = parts["bench"] / float64(locks)
	m.extra["other_bytes_per_lock"] = parts["other"] / float64(locks)
	return m
}

// Memory grants p.memSessions leases (no keepalive needed: TTL 10 min) and
// creates p.memLocks lock keys, exactly the keys concurrency.Mutex.Lock
// creates (pfx/<lease hex>, empty value, attached to the lease), 10 per
// transaction per lease to keep the setup short; it reports the live Go
// heap growth per (key x member).
func (etcdSystem) Memory(ctx context.Context, p *params) (measure, error) {
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
	hBase := stableHeap()
	partsBase := heapParts(etcdParts)
	ids, err := grantLeases(ctx, nil, c.clients, p.memSessions, int64(10*time.Minute/time.Second))
	if err != nil {
		return measure{}, err
	}
	h0 := stableHeap()
	rss0 := rssBytes()
	parts0 := heapParts(etcdParts)
	per := p.memLocks / len(ids)
	pr := newProgress("create lock keys", per*len(ids))
	err = parallel(ctx, len(ids), 256, func(ctx context.Context, i int) error {
		for j := 0; j < per; j += 10 {
			var ops []clientv3.Op
			for k := j; k < min(per, j+10); k++ {
				ops = append(ops, clientv3.OpPut(mutexKey(fmt.Sprintf("/bench/m/%d/%d", i, k), ids[i]), "", clientv3.WithLease(ids[i])))
			}
			if _, err := c.clients[i%3].Txn(ctx).Then(ops...).Commit(); err != nil {
				return err
			}
			pr.add(len(ops))
		}
		return nil
	})
	el := pr.finish()
	if err != nil {
		return measure{}, err
	}
	h1 := stableHeap()
	rss1 := rssBytes()
	parts := heapPartsDelta(parts0, heapParts(etcdParts))
	m := memMeasure(hBase, h0, h1, parts, len(ids), per*len(ids), 3, float64(per*len(ids))/el.Seconds())
	m.extra["rss_growth_bytes_per_lock_x_replica"] = (float64(rss1) - float64(rss0)) / float64(per*len(ids)*3)
	sp := heapPartsDelta(partsBase, parts0)
	m.extra["replica_bytes_per_session_x_replica"] = sp["replica"] / float64(len(ids)*3)
	m.extra["client_bytes_per_session"] = sp["client"] / float64(len(ids))
	return m, nil
}
