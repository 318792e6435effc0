package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quorumlock/quorumlock"
)

// Memory holds p.memLocks locks over p.memSessions sessions and reports the
// growth of the live Go heap of the whole process per (lock x replica):
// every replica and every client of the benchmark share this process, so
// the delta covers three lock tables plus the client-side Lock handles.
// Sessions get the longest TTL so that heartbeats are rare.
func (qlSystem) Memory(ctx context.Context, p *params) (measure, error) {
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
	hBase := stableHeap()
	partsBase := heapParts(qlParts)
	ss, err := c.openSessions(ctx, p.memSessions, c.all(), quorumlock.WithTTL(quorumlock.MaxSessionTTL))
	if err != nil {
		return measure{}, err
	}
	h0 := stableHeap()
	parts0 := heapParts(qlParts)
	per := p.memLocks / len(ss)
	pr := newProgress("acquire locks", per*len(ss))
	p.prof.start()
	err = parallel(ctx, len(ss), 256, func(ctx context.Context, i int) error {
		for j := range per {
			if _, err := ss[i].Acquire(ctx, fmt.Sprintf("m/%d/%d", i, j)); err != nil {
				return err
			}
		}
		pr.add(per)
		return nil
	})
	p.prof.stop()
	el := pr.finish()
	if err != nil {
		return measure{}, err
	}
	h1 := stableHeap()
	parts := heapPartsDelta(parts0, heapParts(qlParts))
	p.prof.heap()
	locks := per * len(ss)
	runtime.KeepAlive(ss)
	m := memMeasure(hBase, h0, h1, parts, len(ss), locks, 3, float64(locks)/el.Seconds())
	sp := heapPartsDelta(partsBase, parts0)
	m.extra["replica_bytes_per_session_x_replica"] = sp["replica"] / float64(len(ss)*3)
	m.extra["client_bytes_per_session"] = sp["client"] / float64(len(ss))
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
			"scope":                    "live Go heap of the whole process (every replica and client) divided by locks x replicas",
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
	parts := heapPartsDelta(parts0, heapParts(etcdParts))
	m := memMeasure(hBase, h0, h1, parts, len(ids), per*len(ids), 3, float64(per*len(ids))/el.Seconds())
	sp := heapPartsDelta(partsBase, parts0)
	m.extra["replica_bytes_per_session_x_replica"] = sp["replica"] / float64(len(ids)*3)
	m.extra["client_bytes_per_session"] = sp["client"] / float64(len(ids))
	return m, nil
}
