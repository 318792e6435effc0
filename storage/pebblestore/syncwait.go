package pebblestore

import (
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"
)

// How a WAL sync waits.
//
// A goroutine blocked in fdatasync(2) keeps its processor (P): the Go
// scheduler hands a P that sits in a system call to another thread only when
// sysmon retakes it, after at least two sysmon ticks of 20 us, and sysmon
// stretches its tick towards 10 ms while it finds nothing to retake, which
// is what syncs shorter than that make it find (runtime/proc.go, retake and
// sysmon). A raft log sync takes 0.15-0.6 ms on this project's machine and
// comes once per Ready, so a busy replica runs with one P fewer for much of
// the time, and in the benchmark three replicas in one process on two cores
// often leave no P at all for the goroutines that have work. Measured with
// `go run ./bench -scenarios uncontended_64,uncontended_256 -systems ours`:
// GOMAXPROCS=4 on the 2-core machine gave 45-52% more cycles/s with
// blocking syncs, and with syncs disabled (a throwaway build) GOMAXPROCS made
// no difference.
//
// Waiting without a P has its own cost when Ps are idle: the completion
// reaches the goroutine through a kernel worker, an eventfd and the
// netpoller instead of waking the blocked thread directly. Always waiting
// that way added 0.04 ms to latency_1's acquire p50 and cost 4-10% of
// handoff_16's hand-offs/s.
//
// So a WAL file on the operating system's file system waits off the P only
// while goroutines are measurably waiting for Ps: schedPressure reads the
// runtime's scheduling-latency histogram (/sched/latencies:seconds, the time
// goroutines spend runnable before they run) every pressureEvery syncs and
// turns on when the window's 90th percentile reaches pressureOn, off when it
// falls below pressureOff or the window holds fewer than
// pressureMinSamples events (a quiet process). The gap keeps it from
// flapping, since waiting off the P itself lowers the latency it measures.

const (
	pressureEvery      = 16     // syncs between two reads of the histogram
	pressureMinSamples = 64     // fewer scheduling events in a window: pressure off
	pressureOn         = 200e-6 // seconds: p90 at or above it turns pressure on
	pressureOff        = 50e-6  // seconds: p90 below it turns pressure off
)

// offCPUSyncer syncs a file's data without holding a P while it waits
// (aiosync_linux.go). syncData returns fallback() when the kernel refuses
// the request before queueing it.
type offCPUSyncer interface {
	syncData(fd int, fallback func() error) error
	close() error
}

// schedPressure says whether goroutines are waiting for processors (see
// above). Its zero value is not usable; make one with newSchedPressure.
type schedPressure struct {
	// sample returns the cumulative scheduling-latency histogram, or nil if
	// the runtime does not provide it. Tests replace it.
	sample func() *metrics.Float64Histogram

	mu    sync.Mutex
	calls int
	prev  []uint64 // the histogram's counts at the last read
	on    bool
}

func newSchedPressure() *schedPressure {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	return &schedPressure{sample: func() *metrics.Float64Histogram {
		metrics.Read(s) // s is reused under schedPressure.mu
		if s[0].Value.Kind() != metrics.KindFloat64Histogram {
			return nil
		}
		return s[0].Value.Float64Histogram()
	}}
}

// high reports whether the next sync should wait off the P. Every
// pressureEvery calls it reads the histogram and updates its state.
func (p *schedPressure) high() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.calls++; p.calls < pressureEvery {
		return p.on
	}
	p.calls = 0
	h := p.sample()
	if h == nil {
		return p.on
	}
	if len(p.prev) != len(h.Counts) {
		p.prev = slices.Clone(h.Counts)
		return p.on
	}
	switch p90, ok := windowP90(h, p.prev); {
	case !ok:
		p.on = false // a quiet process: nothing waits for a P
	case !p.on && p90 >= pressureOn:
		p.on = true
	case p.on && p90 < pressureOff:
		p.on = false
	}
	copy(p.prev, h.Counts)
	return p.on
}

// windowP90 returns the lower bound of the bucket holding the 90th
// percentile of the events in h since prev (the same buckets), or false if
// there are fewer than pressureMinSamples of them.
func windowP90(h *metrics.Float64Histogram, prev []uint64) (float64, bool) {
	var n uint64
	for i, c := range h.Counts {
		n += c - prev[i]
	}
	if n < pressureMinSamples {
		return 0, false
	}
	want, cum := n-n/10, uint64(0)
	for i, c := range h.Counts {
		if cum += c - prev[i]; cum >= want {
			return h.Buckets[i], true
		}
	}
	return h.Buckets[len(h.Counts)-1], true // not reached: cum ends at n
}

// walSyncs decides how a store's WAL syncs wait, and owns the store's
// offCPUSyncer, made at the first sync under pressure.
type walSyncs struct {
	pressure *schedPressure
	log      *zap.Logger

	mu     sync.Mutex
	syncer offCPUSyncer // nil until the first sync under pressure
	noAIO  bool         // newSyncer failed: syncs block
	closed bool

	// Syncs by how they waited, for tests and curiosity.
	offCPU, blocked atomic.Uint64
}

func newWALSyncs(log *zap.Logger) *walSyncs {
	return &walSyncs{pressure: newSchedPressure(), log: log}
}

// syncData syncs f's data: off the P under pressure, else in f.SyncData.
func (w *walSyncs) syncData(f vfs.File) error {
	fd := f.Fd()
	if fd == vfs.InvalidFd || !w.pressure.high() {
		w.blocked.Add(1)
		return f.SyncData()
	}
	s := w.offCPUSyncer()
	if s == nil {
		w.blocked.Add(1)
		return f.SyncData()
	}
	w.offCPU.Add(1)
	return s.syncData(int(fd), f.SyncData)
}

func (w *walSyncs) offCPUSyncer() offCPUSyncer {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.syncer == nil && !w.noAIO && !w.closed {
		s, err := newOffCPUSyncer()
		if err != nil {
			w.noAIO = true
			w.log.Info("WAL syncs will block in fdatasync under scheduling pressure too", zap.Error(err))
			return nil
		}
		w.syncer = s
	}
	return w.syncer
}

// close releases the syncer. Call it after Pebble is closed. A nil
// walSyncs has nothing to release.
func (w *walSyncs) close() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.syncer == nil {
		return nil
	}
	return w.syncer.close()
}

// offCPUFile is a WAL file whose SyncData goes through the store's
// walSyncs.
type offCPUFile struct {
	sizingFile
	syncs *walSyncs
}

func (f offCPUFile) SyncData() error { return f.syncs.syncData(f.File) }

// wrapWAL returns a WAL file for Pebble: sized ahead always, syncing
// through fs.syncs when the store has one, and reporting its failures to
// the store rather than to Pebble (walFile) when fs.onWALError is set.
func (fs walSizingFS) wrapWAL(name string, f vfs.File) vfs.File {
	if fs.syncs != nil {
		f = offCPUFile{sizingFile: sizingFile{f}, syncs: fs.syncs}
	} else {
		f = sizingFile{f}
	}
	if fs.onWALError == nil {
		return f
	}
	return walFile{File: f, name: fs.PathBase(name), onErr: fs.onWALError, failed: fs.failed}
}

// setSample replaces the histogram source (tests).
func (p *schedPressure) setSample(f func() *metrics.Float64Histogram) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sample, p.prev, p.calls = f, nil, 0
}
