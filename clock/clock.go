// Package clock is the time source quorumlock reads: the real monotonic clock
// in production, and a manual clock that tests advance by hand.
//
// Every duration quorumlock measures (session TTLs on the leader, the
// client's lease, raft ticks) is taken from one Clock passed in through
// Config; nothing reads the wall clock, and no two processes compare their
// readings (DESIGN.md, "Time").
package clock

import (
	"sync"
	"time"
)

// Clock tells the time and schedules work. Implementations are safe for
// concurrent use.
type Clock interface {
	// Now returns the current reading. Only differences between readings of
	// the same Clock are meaningful.
	Now() time.Time
	// NewTicker returns a ticker that fires every d. d must be positive:
	// both implementations panic otherwise, as time.NewTicker does.
	NewTicker(d time.Duration) Ticker
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Ticker delivers ticks on C until stopped.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether it did.
	Stop() bool
}

// Real returns the process's monotonic clock (package time).
func Real() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }

// Manual is a Clock that moves only when Advance is called. Tickers and
// timers due at or before the new time fire during Advance, in time order:
// a ticker's tick is sent (or dropped) before Advance moves on, a timer's
// f is started in its own goroutine, which Advance does not wait for (so
// two timers' functions may run in either order). A timer due at or before
// the current time (d <= 0) fires at the next Advance, even Advance(0).
type Manual struct {
	mu      sync.Mutex
	now     time.Time
	waiters []*manualWaiter
}

type manualWaiter struct {
	at      time.Time
	period  time.Duration // > 0 for tickers
	c       chan time.Time
	f       func()
	stopped bool
}

// NewManual returns a manual clock reading start.
func NewManual(start time.Time) *Manual { return &Manual{now: start} }

// Now returns the manual reading.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// NewTicker returns a ticker driven by Advance. Like time.Ticker it drops
// ticks a slow receiver does not take, delivers none after Stop returns
// (not even one it kept for a slow receiver), and it panics for d <= 0.
func (m *Manual) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		// As time.NewTicker: at the call, rather than as a crash in a
		// later Advance, which would take the ticker for a timer.
		panic("clock: non-positive interval for Manual.NewTicker")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	w := &manualWaiter{at: m.now.Add(d), period: d, c: make(chan time.Time, 1)}
	m.waiters = append(m.waiters, w)
	return manualTicker{m, w}
}

// AfterFunc schedules f for when the clock has advanced by d.
func (m *Manual) AfterFunc(d time.Duration, f func()) Timer {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := &manualWaiter{at: m.now.Add(d), f: f}
	m.waiters = append(m.waiters, w)
	return manualTimer{m, w}
}

// Pending returns the number of armed timers and tickers, so a test can
// wait until the code under test has scheduled its next wake-up before it
// advances the clock.
func (m *Manual) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.waiters)
}

// Advance moves the clock forward by d, firing what falls due. The reading
// never goes back: a negative d counts as 0 (it fires what is due now), and
// so does the part of d that a concurrent Advance has already covered.
func (m *Manual) Advance(d time.Duration) {
	m.mu.Lock()
	target := m.now.Add(max(d, 0))
	for {
		var next *manualWaiter
		for _, w := range m.waiters {
			if !w.stopped && !w.at.After(target) && (next == nil || w.at.Before(next.at)) {
				next = w
			}
		}
		if next == nil {
			break
		}
		if next.at.After(m.now) { // a timer armed in the past does not set the clock back
			m.now = next.at
		}
		if next.period > 0 {
			next.at = next.at.Add(next.period)
			select {
			case next.c <- m.now:
			default:
			}
			continue
		}
		next.stopped = true
		m.remove(next)
		f := next.f
		m.mu.Unlock()
		go f()
		m.mu.Lock()
	}
	if target.After(m.now) {
		m.now = target
	}
	m.mu.Unlock()
}

func (m *Manual) remove(w *manualWaiter) {
	for i, x := range m.waiters {
		if x == w {
			m.waiters = append(m.waiters[:i], m.waiters[i+1:]...)
			return
		}
	}
}

type manualTicker struct {
	m *Manual
	w *manualWaiter
}

func (t manualTicker) C() <-chan time.Time { return t.w.c }
func (t manualTicker) Stop() {
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	t.w.stopped = true
	t.m.remove(t.w)
	// As time.Ticker (Go 1.23 on): no tick prepared before Stop is
	// received after it. Advance sends under mu, so none is sent later.
	select {
	case <-t.w.c:
	default:
	}
}

type manualTimer struct {
	m *Manual
	w *manualWaiter
}

func (t manualTimer) Stop() bool {
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	if t.w.stopped {
		return false
	}
	t.w.stopped = true
	t.m.remove(t.w)
	return true
}
