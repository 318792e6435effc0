package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// loopResult is what a set of clients looping lock+unlock achieved inside
// the measurement window.
type loopResult struct {
	window   time.Duration
	cycles   int64           // lock+unlock cycles completed inside the window
	acquires int64           // locks obtained inside the window
	acq, rel []time.Duration // latencies of cycles that started inside it
	errors   int64
	firstErr error
	cpu      time.Duration // process CPU time (user + system) in the window
	sched    schedLatency  // goroutine scheduling latency in the window
	saves    logSyncs      // log writes of every member in the window
}

// maxSamples bounds the latencies kept per client.
const maxSamples = 200_000

// runLoop has client i lock and unlock name(i) in a loop: warm-up, then the
// measurement window (profiled when asked), then every client finishes its
// cycle and stops.
func runLoop(ctx context.Context, p *params, c cluster, lockers []locker, name func(i int) string) loopResult {
	start := time.Now()
	mStart := start.Add(p.warmup)
	end := mStart.Add(p.duration)
	cctx, cancel := context.WithDeadline(ctx, end.Add(30*time.Second))
	defer cancel()

	var (
		res      loopResult
		cycles   atomic.Int64
		acquires atomic.Int64
		errs     atomic.Int64
		mu       sync.Mutex
		wg       sync.WaitGroup
	)
	for i, l := range lockers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var acq, rel []time.Duration
			fail := func(err error) {
				errs.Add(1)
				mu.Lock()
				if res.firstErr == nil {
					res.firstErr = err
				}
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
			for cctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				unlock, err := l.Lock(cctx, name(i))
				if err != nil {
					fail(err)
					continue
				}
				t1 := time.Now()
				err = unlock(cctx)
				t2 := time.Now()
				if err != nil {
					fail(err)
					continue
				}
				if !t1.Before(mStart) && !t1.After(end) {
					acquires.Add(1)
				}
				if !t2.Before(mStart) && !t2.After(end) {
					cycles.Add(1)
				}
				if !t0.Before(mStart) && len(acq) < maxSamples {
					acq = append(acq, t1.Sub(t0))
					rel = append(rel, t2.Sub(t1))
				}
			}
			mu.Lock()
			res.acq = append(res.acq, acq...)
			res.rel = append(res.rel, rel...)
			mu.Unlock()
		}()
	}
	sleepUntil(ctx, mStart)
	p.prof.start()
	cpu0, sched0, saves0 := cpuTime(), readSchedLatency(), c.LogSyncs()
	sleepUntil(ctx, end)
	res.cpu = cpuTime() - cpu0
	res.sched = readSchedLatency().since(sched0)
	res.saves = c.LogSyncs().since(saves0)
	p.prof.stop()
	wg.Wait()
	res.window = p.duration
	res.cycles, res.acquires, res.errors = cycles.Load(), acquires.Load(), errs.Load()
	return res
}

func sleepUntil(ctx context.Context, t time.Time) {
	select {
	case <-time.After(time.Until(t)):
	case <-ctx.Done():
	}
}

func (r loopResult) extra(m map[string]any) map[string]any {
	m["acquire_p50_ms"] = ms(percentile(r.acq, 50))
	m["acquire_p99_ms"] = ms(percentile(r.acq, 99))
	m["release_p50_ms"] = ms(percentile(r.rel, 50))
	m["window_s"] = r.window.Seconds()
	if r.cycles > 0 {
		// The whole process: every replica and every client.
		m["cpu_us_per_cycle"] = float64(r.cpu.Microseconds()) / float64(r.cycles)
		m["process_cores_busy"] = r.cpu.Seconds() / r.window.Seconds()
	}
	if r.saves.count > 0 && r.cycles > 0 {
		m["log_syncs_per_cycle"] = float64(r.saves.count) / float64(r.cycles)
		m["log_sync_mean_ms"] = r.saves.seconds / float64(r.saves.count) * 1e3
	}
	if r.sched.count() > 0 {
		m["sched_latency_p50_us"] = r.sched.quantile(0.5) * 1e6
		m["sched_latency_p90_us"] = r.sched.quantile(0.9) * 1e6
	}
	m["errors"] = r.errors
	if r.firstErr != nil {
		m["first_error"] = r.firstErr.Error()
	}
	return m
}

// withCluster starts a cluster of n members for one system, runs f, and
// closes it.
func withCluster(ctx context.Context, sys system, p *params, n int, f func(c cluster) (measure, error)) (measure, error) {
	dir, err := os.MkdirTemp(p.dir, sys.Name()+"-")
	if err != nil {
		return measure{}, err
	}
	defer os.RemoveAll(dir)
	c, err := sys.Start(ctx, n, dir)
	if err != nil {
		return measure{}, err
	}
	defer c.Close()
	return f(c)
}

// newLockers opens n clients, client i through member i % members.
func newLockers(ctx context.Context, c cluster, n int, member func(i int) int) ([]locker, func(), error) {
	ls := make([]locker, n)
	err := parallel(ctx, n, 64, func(ctx context.Context, i int) error {
		l, err := c.NewLocker(ctx, member(i))
		ls[i] = l
		return err
	})
	closeAll := func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		parallel(cctx, n, 64, func(ctx context.Context, i int) error {
			if ls[i] != nil {
				ls[i].Close(ctx)
			}
			return nil
		})
	}
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return ls, closeAll, nil
}

// uncontended: n clients, each with its own session, acquire and release
// their own name in a loop. Clients are spread evenly over the members.
func uncontended(clients, members int) func(ctx context.Context, sys system, p *params) (measure, error) {
	return func(ctx context.Context, sys system, p *params) (measure, error) {
		return withCluster(ctx, sys, p, members, func(c cluster) (measure, error) {
			ls, closeAll, err := newLockers(ctx, c, clients, func(i int) int { return i % members })
			if err != nil {
				return measure{}, err
			}
			defer closeAll()
			r := runLoop(ctx, p, c, ls, func(i int) string { return fmt.Sprintf("u/%d", i) })
			if r.cycles == 0 {
				return measure{}, fmt.Errorf("no cycle completed (%d errors, first: %v)", r.errors, r.firstErr)
			}
			return measure{
				value: float64(r.cycles) / r.window.Seconds(),
				extra: r.extra(map[string]any{"clients": clients, "members": members}),
			}, nil
		})
	}
}

// handoff: clients contend on one name; every acquire is a hand-off from
// the previous holder.
func handoff(clients int) func(ctx context.Context, sys system, p *params) (measure, error) {
	return func(ctx context.Context, sys system, p *params) (measure, error) {
		return withCluster(ctx, sys, p, 3, func(c cluster) (measure, error) {
			ls, closeAll, err := newLockers(ctx, c, clients, func(i int) int { return i % 3 })
			if err != nil {
				return measure{}, err
			}
			defer closeAll()
			r := runLoop(ctx, p, c, ls, func(int) string { return "contended" })
			if r.acquires == 0 {
				return measure{}, fmt.Errorf("no acquire completed (%d errors, first: %v)", r.errors, r.firstErr)
			}
			return measure{
				value: float64(r.acquires) / r.window.Seconds(),
				extra: r.extra(map[string]any{"clients": clients}),
			}, nil
		})
	}
}

// latency1: one client, on the leader's member, acquires and releases one
// name in a loop; the value is the acquire p50 in ms.
func latency1(ctx context.Context, sys system, p *params) (measure, error) {
	return withCluster(ctx, sys, p, 3, func(c cluster) (measure, error) {
		leader, err := c.Leader(ctx)
		if err != nil {
			return measure{}, err
		}
		ls, closeAll, err := newLockers(ctx, c, 1, func(int) int { return leader })
		if err != nil {
			return measure{}, err
		}
		defer closeAll()
		r := runLoop(ctx, p, c, ls, func(int) string { return "latency" })
		if len(r.acq) == 0 {
			return measure{}, fmt.Errorf("no sample (%d errors, first: %v)", r.errors, r.firstErr)
		}
		return measure{
			value: ms(percentile(r.acq, 50)),
			extra: r.extra(map[string]any{"samples": len(r.acq), "client": "on the leader's member"}),
		}, nil
	})
}

// failover: stop the leader as in a crash, then time the first successful
// acquire by a client (already connected) on a surviving member. Repeated,
// restarting the stopped member in between.
func failover(ctx context.Context, sys system, p *params) (measure, error) {
	return leaderLoss(ctx, sys, p, cluster.Stop)
}

// leaderShutdown: failover with the leader shut down the way an operator
// does (a rolling restart): both systems hand leadership over first.
func leaderShutdown(ctx context.Context, sys system, p *params) (measure, error) {
	return leaderLoss(ctx, sys, p, cluster.Shutdown)
}

func leaderLoss(ctx context.Context, sys system, p *params, stop func(c cluster, member int) error) (measure, error) {
	return withCluster(ctx, sys, p, 3, func(c cluster) (measure, error) {
		var ds []time.Duration
		p.prof.start()
		defer p.prof.stop()
		for r := range p.failoverRepeats {
			d, err := failoverOnce(ctx, c, r, stop)
			if err != nil {
				return measure{}, fmt.Errorf("repeat %d: %w", r, err)
			}
			logf("  leader lost %d: %v", r, d.Round(time.Millisecond))
			ds = append(ds, d)
		}
		all := make([]float64, len(ds))
		for i, d := range ds {
			all[i] = ms(d)
		}
		return measure{
			value: ms(percentile(ds, 50)),
			extra: map[string]any{"max_ms": ms(percentile(ds, 100)), "all_ms": all, "repeats": len(ds),
				"election_timeout_ms": ms(election), "attempt_timeout_ms": ms(c.AttemptTimeout())},
		}, nil
	})
}

func failoverOnce(ctx context.Context, c cluster, r int, stop func(c cluster, member int) error) (time.Duration, error) {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	leader, err := c.Leader(lctx)
	if err != nil {
		return 0, err
	}
	survivor := (leader + 1) % c.Members()
	l, err := c.NewLocker(lctx, survivor)
	if err != nil {
		return 0, err
	}
	defer l.Close(lctx)
	// Warm the client's path to the leader first.
	unlock, err := l.Lock(lctx, "warm")
	if err != nil {
		return 0, err
	}
	if err := unlock(lctx); err != nil {
		return 0, err
	}

	// The stop runs alongside the client: a graceful stop may still be
	// closing its servers when the cluster serves again, and the client
	// does not wait for it.
	t0 := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- stop(c, leader) }()
	name := fmt.Sprintf("failover/%d", r)
	unlock, err = lockThroughFailover(lctx, l, name, c.AttemptTimeout())
	if err != nil {
		<-stopped
		return 0, fmt.Errorf("no acquire within 30 s of stopping the leader: %w", err)
	}
	d := time.Since(t0)
	unlock(lctx)
	if err := <-stopped; err != nil {
		return 0, err
	}
	if err := c.Restart(lctx, leader); err != nil {
		return 0, fmt.Errorf("restarting member %d: %w", leader, err)
	}
	if _, err := c.Leader(lctx); err != nil {
		return 0, err
	}
	// Let the restarted member catch up before the next round.
	time.Sleep(500 * time.Millisecond)
	return d, nil
}

// lockThroughFailover takes name as soon as the cluster allows. With an
// attempt timeout, a new attempt starts every 20 ms (each bounded by it),
// so that the first success is seen within 20 ms of becoming possible
// rather than at the end of a hung attempt; the rest are cancelled. The
// attempts share one session, so they all ask for the same lock key.
func lockThroughFailover(ctx context.Context, l locker, name string, attempt time.Duration) (func(context.Context) error, error) {
	if attempt == 0 {
		return l.Lock(ctx, name)
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	won := make(chan func(context.Context) error, 1)
	var (
		mu      sync.Mutex
		lastErr error
	)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		go func() {
			a, acancel := context.WithTimeout(actx, attempt)
			defer acancel()
			unlock, err := l.Lock(a, name)
			if err != nil {
				mu.Lock()
				lastErr = err
				mu.Unlock()
				return
			}
			select {
			case won <- unlock:
			default:
			}
		}()
		select {
		case unlock := <-won:
			return unlock, nil
		case <-ctx.Done():
			mu.Lock()
			defer mu.Unlock()
			return nil, errors.Join(ctx.Err(), lastErr)
		case <-tick.C:
		}
	}
}
