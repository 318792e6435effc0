package main

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// percentile returns the p-th percentile (0..100) of ds, nearest rank; 0
// for none. ds is sorted in place.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(float64(len(ds))*p/100+0.5) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// cpuTime is the CPU time (user + system) this process has used. Every
// replica, client and etcd member of the benchmark runs in this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// liveHeap collects garbage and returns the bytes of live Go heap.
func liveHeap() uint64 {
	// Three cycles: the runtime's heap profile (heapParts) lags up to two.
	runtime.GC()
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// rssBytes returns this process's resident set size (VmRSS of
// /proc/self/status), 0 where that cannot be read. Unlike the live Go heap
// it includes memory outside the heap (Pebble's memtables and block cache,
// allocated with C malloc when cgo is on; bbolt's mmap-ed file pages that
// were touched) and freed heap the runtime has not returned to the OS.
func rssBytes() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" && f[2] == "kB" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// stableHeap returns the live heap once it has settled: goroutines of a
// cluster closed just before (etcd's in particular) may still be letting
// go of memory for seconds. It reads liveHeap every 500 ms until three
// readings in a row differ by less than 256 KiB and the goroutine count has
// stopped falling (at most 15 s).
func stableHeap() uint64 {
	h, g := liveHeap(), runtime.NumGoroutine()
	calm := 0
	for range 30 {
		time.Sleep(500 * time.Millisecond)
		n, ng := liveHeap(), runtime.NumGoroutine()
		d := int64(n) - int64(h)
		if d > -256<<10 && d < 256<<10 && ng >= g {
			calm++
		} else {
			calm = 0
		}
		h, g = n, ng
		if calm == 2 {
			break
		}
	}
	return h
}

// fsyncLatency appends 100 B to a file in dir and fdatasyncs it, n times
// (or until budget runs out), the way a log appends, and returns the
// latencies of write+fdatasync.
func fsyncLatency(dir string, n int, budget time.Duration) ([]time.Duration, error) {
	f, err := os.CreateTemp(dir, "fsync-probe-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 100)
	out := make([]time.Duration, 0, n)
	end := time.Now().Add(budget)
	for i := 0; i < n && time.Now().Before(end); i++ {
		t := time.Now()
		if _, err := f.Write(buf); err != nil {
			return nil, err
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return nil, fmt.Errorf("fdatasync: %w", err)
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05.000")+" "+format+"\n", args...)
}

// loadAvg returns the machine's 1-minute load average (-1 if unknown): the
// machine may be shared, and a busy one makes every number here worse.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// schedLatency is the runtime's histogram of the time goroutines spent
// runnable before running (runtime/metrics "/sched/latencies:seconds"). On
// a machine whose cores are busy, every hand-off between goroutines on a
// request's path (client, gRPC reader and writer, raft loop, fsync) waits
// about this long, so it shows how much of a latency is queueing for a CPU.
type schedLatency struct {
	buckets []float64 // boundaries, seconds: bucket i is [buckets[i], buckets[i+1])
	counts  []uint64
}

func readSchedLatency() schedLatency {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return schedLatency{}
	}
	h := s[0].Value.Float64Histogram()
	return schedLatency{buckets: h.Buckets, counts: slices.Clone(h.Counts)}
}

// since returns the samples recorded after earlier was read.
func (l schedLatency) since(earlier schedLatency) schedLatency {
	if len(earlier.counts) != len(l.counts) {
		return l
	}
	d := schedLatency{buckets: l.buckets, counts: make([]uint64, len(l.counts))}
	for i := range l.counts {
		d.counts[i] = l.counts[i] - earlier.counts[i]
	}
	return d
}

func (l schedLatency) count() uint64 {
	var n uint64
	for _, c := range l.counts {
		n += c
	}
	return n
}

// quantile returns the upper boundary of the bucket holding quantile q
// (0..1), in seconds: the histogram's buckets are a few percent wide.
func (l schedLatency) quantile(q float64) float64 {
	n := l.count()
	var cum uint64
	for i, c := range l.counts {
		cum += c
		if c > 0 && float64(cum) >= q*float64(n) {
			if hi := l.buckets[i+1]; !math.IsInf(hi, 1) {
				return hi
			}
			return l.buckets[i]
		}
	}
	return 0
}
