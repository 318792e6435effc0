package harness

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/quorumlock/quorumlock/clock"
)

// pausableClock is the real clock of one process (a replica or a remote
// client) that can be frozen the way SIGSTOP freezes a process: while it is
// frozen no tick is delivered and no timer runs, but Now goes on, as the
// host's monotonic clock does. On thaw a ticker delivers one tick (a
// time.Ticker drops the ticks a slow reader missed) and the timers that
// came due meanwhile run, late, as they would after SIGCONT.
//
// Together with links that stall both ways (Cluster.Pause) and workers that
// stop at their next fenced write (gate; their other calls stall on the
// links), this is an in-process
// approximation of SIGSTOP/SIGCONT: the process's own goroutines that are
// not driven by its clock (applying entries already committed, serving a
// request already received) are not stopped.
type pausableClock struct {
	mu     sync.Mutex
	frozen chan struct{} // non-nil while frozen; closed by thaw
	held   atomic.Int64  // gate calls that waited for a thaw
}

var _ clock.Clock = (*pausableClock)(nil)

func (p *pausableClock) Now() time.Time { return time.Now() }

// freeze stops the clock until thaw; a second freeze is a no-op.
func (p *pausableClock) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen == nil {
		p.frozen = make(chan struct{})
	}
}

// thaw restarts the clock.
func (p *pausableClock) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen != nil {
		close(p.frozen)
		p.frozen = nil
	}
}

// wait returns when the clock is not frozen, or when stop closes; it
// reports whether it had to wait.
func (p *pausableClock) wait(stop <-chan struct{}) bool {
	p.mu.Lock()
	c := p.frozen
	p.mu.Unlock()
	if c == nil {
		return false
	}
	select {
	case <-c:
	case <-stop:
	}
	return true
}

// gate holds the caller (a worker of this process about to make a fenced
// write) while the process is paused, and counts the calls it held.
func (p *pausableClock) gate() {
	if p.wait(nil) {
		p.held.Add(1)
	}
}

func (p *pausableClock) NewTicker(d time.Duration) clock.Ticker {
	t := &pausableTicker{t: time.NewTicker(d), c: make(chan time.Time, 1), stop: make(chan struct{})}
	go func() {
		for {
			select {
			case <-t.stop:
				return
			case v := <-t.t.C:
				p.wait(t.stop)
				select {
				case t.c <- v:
				default:
				}
			}
		}
	}()
	return t
}

type pausableTicker struct {
	t    *time.Ticker
	c    chan time.Time
	stop chan struct{}
	once sync.Once
}

func (t *pausableTicker) C() <-chan time.Time { return t.c }

func (t *pausableTicker) Stop() {
	t.once.Do(func() {
		t.t.Stop()
		close(t.stop)
	})
}

func (p *pausableClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := &pausableTimer{}
	t.t = time.AfterFunc(d, func() {
		p.wait(nil)
		t.mu.Lock()
		if t.state != timerPending {
			t.mu.Unlock()
			return
		}
		t.state = timerStarted
		t.mu.Unlock()
		f()
	})
	return t
}

const (
	timerPending = iota
	timerStarted
	timerStopped
)

// pausableTimer is an AfterFunc timer whose call, once due, waits for a
// thaw; Stop prevents a call that has not started, even one that came due
// while the clock was frozen.
type pausableTimer struct {
	t     *time.Timer
	mu    sync.Mutex
	state int
}

func (t *pausableTimer) Stop() bool {
	t.t.Stop()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state == timerPending {
		t.state = timerStopped
		return true
	}
	return false
}
