package clock

import (
	"sync/atomic"
	"testing"
	"time"
)

var start = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// wait bounds a wait for something that must happen.
const wait = 5 * time.Second

// tick returns the tick buffered on c, if any.
func tick(c <-chan time.Time) (time.Time, bool) {
	select {
	case t := <-c:
		return t, true
	default:
		return time.Time{}, false
	}
}

func TestManualNow(t *testing.T) {
	m := NewManual(start)
	if got := m.Now(); !got.Equal(start) {
		t.Fatalf("Now() = %v, want %v", got, start)
	}
	m.Advance(1500 * time.Millisecond)
	m.Advance(0)
	if got, want := m.Now(), start.Add(1500*time.Millisecond); !got.Equal(want) {
		t.Fatalf("Now() after Advance = %v, want %v", got, want)
	}
}

func TestManualTicker(t *testing.T) {
	m := NewManual(start)
	tk := m.NewTicker(10 * time.Second)

	m.Advance(9 * time.Second)
	if got, ok := tick(tk.C()); ok {
		t.Fatalf("tick at %v, before the first period ended", got)
	}
	m.Advance(time.Second)
	if got, ok := tick(tk.C()); !ok || !got.Equal(start.Add(10*time.Second)) {
		t.Fatalf("after one period: tick %v, %v; want %v", got, ok, start.Add(10*time.Second))
	}
	if _, ok := tick(tk.C()); ok {
		t.Fatal("a second tick after one period")
	}

	// Three periods in one Advance: the receiver was not taking ticks, so,
	// like time.Ticker, one tick is buffered (the first) and the rest drop.
	m.Advance(35 * time.Second)
	if got, ok := tick(tk.C()); !ok || !got.Equal(start.Add(20*time.Second)) {
		t.Fatalf("after three periods: tick %v, %v; want the one of %v", got, ok, start.Add(20*time.Second))
	}
	if got, ok := tick(tk.C()); ok {
		t.Fatalf("a second buffered tick %v", got)
	}
	if got, want := m.Now(), start.Add(45*time.Second); !got.Equal(want) {
		t.Fatalf("Now() = %v, want %v", got, want)
	}
	// The schedule stays on multiples of the period.
	m.Advance(4 * time.Second)
	if got, ok := tick(tk.C()); ok {
		t.Fatalf("tick at %v before the period at 50s", got)
	}
	m.Advance(time.Second)
	if got, ok := tick(tk.C()); !ok || !got.Equal(start.Add(50*time.Second)) {
		t.Fatalf("tick %v, %v; want %v", got, ok, start.Add(50*time.Second))
	}

	if n := m.Pending(); n != 1 {
		t.Fatalf("Pending() = %d with one ticker, want 1", n)
	}
	tk.Stop()
	if n := m.Pending(); n != 0 {
		t.Fatalf("Pending() = %d after Stop, want 0", n)
	}
	m.Advance(time.Minute)
	if got, ok := tick(tk.C()); ok {
		t.Fatalf("tick %v after Stop", got)
	}
}

func TestManualTickersIndependent(t *testing.T) {
	m := NewManual(start)
	fast, slow := m.NewTicker(time.Second), m.NewTicker(3*time.Second)
	var nfast, nslow int
	for range 6 {
		m.Advance(time.Second)
		if _, ok := tick(fast.C()); ok {
			nfast++
		}
		if _, ok := tick(slow.C()); ok {
			nslow++
		}
	}
	if nfast != 6 || nslow != 2 {
		t.Fatalf("over 6 s: %d ticks of the 1 s ticker, %d of the 3 s one; want 6 and 2", nfast, nslow)
	}
	fast.Stop()
	slow.Stop()
}

func TestManualAfterFunc(t *testing.T) {
	m := NewManual(start)
	var calls atomic.Int32
	seen := make(chan time.Time, 2)
	m.AfterFunc(5*time.Second, func() {
		calls.Add(1)
		seen <- m.Now()
	})
	if n := m.Pending(); n != 1 {
		t.Fatalf("Pending() = %d, want 1", n)
	}

	m.Advance(4999 * time.Millisecond)
	// Not due: still armed, so Advance started no call.
	if n := m.Pending(); n != 1 {
		t.Fatalf("Pending() = %d before the timer was due, want 1", n)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("called %d times before due", n)
	}

	m.Advance(time.Millisecond)
	select {
	case at := <-seen:
		if at.Before(start.Add(5 * time.Second)) {
			t.Fatalf("f saw Now() = %v, before its due time", at)
		}
	case <-time.After(wait):
		t.Fatal("AfterFunc was not called once due")
	}
	if n := m.Pending(); n != 0 {
		t.Fatalf("Pending() = %d after the timer fired, want 0", n)
	}
	m.Advance(time.Hour)
	if n := calls.Load(); n != 1 {
		t.Fatalf("called %d times, want 1", n)
	}
}

func TestManualAfterFuncDueAndStop(t *testing.T) {
	m := NewManual(start)
	fired := make(chan int, 3)
	timers := []Timer{
		m.AfterFunc(3*time.Second, func() { fired <- 3 }),
		m.AfterFunc(1*time.Second, func() { fired <- 1 }),
		m.AfterFunc(2*time.Second, func() { fired <- 2 }),
	}
	if !timers[2].Stop() {
		t.Fatal("Stop on an armed timer = false, want true")
	}
	if timers[2].Stop() {
		t.Fatal("second Stop = true, want false")
	}
	if n := m.Pending(); n != 2 {
		t.Fatalf("Pending() = %d after one Stop, want 2", n)
	}

	m.Advance(time.Second)
	select {
	case got := <-fired:
		if got != 1 {
			t.Fatalf("timer %d fired at 1 s", got)
		}
	case <-time.After(wait):
		t.Fatal("the 1 s timer did not fire")
	}
	if timers[1].Stop() {
		t.Fatal("Stop on a fired timer = true, want false")
	}

	m.Advance(10 * time.Second)
	select {
	case got := <-fired:
		if got != 3 {
			t.Fatalf("timer %d fired, want the 3 s one (the 2 s one was stopped)", got)
		}
	case <-time.After(wait):
		t.Fatal("the 3 s timer did not fire")
	}
	if n := m.Pending(); n != 0 {
		t.Fatalf("Pending() = %d, want 0", n)
	}
	if len(fired) != 0 {
		t.Fatalf("the stopped timer fired: %d", <-fired)
	}
}

// A timer armed from inside another timer's callback is scheduled from the
// clock's time then, and fires on a later Advance.
func TestManualAfterFuncRearm(t *testing.T) {
	m := NewManual(start)
	done := make(chan struct{})
	armed := make(chan struct{})
	m.AfterFunc(time.Second, func() {
		m.AfterFunc(time.Second, func() { close(done) })
		close(armed)
	})
	m.Advance(time.Second)
	select {
	case <-armed:
	case <-time.After(wait):
		t.Fatal("first timer did not fire")
	}
	if n := m.Pending(); n != 1 {
		t.Fatalf("Pending() = %d after re-arming, want 1", n)
	}
	m.Advance(time.Second)
	select {
	case <-done:
	case <-time.After(wait):
		t.Fatal("re-armed timer did not fire")
	}
}

func TestReal(t *testing.T) {
	c := Real()
	t0 := c.Now()
	tk := c.NewTicker(time.Millisecond)
	select {
	case <-tk.C():
	case <-time.After(wait):
		t.Fatal("real ticker did not tick")
	}
	tk.Stop()
	if d := c.Now().Sub(t0); d < time.Millisecond {
		t.Fatalf("Now() moved %v across a 1 ms tick", d)
	}

	fired := make(chan struct{})
	c.AfterFunc(time.Millisecond, func() { close(fired) })
	select {
	case <-fired:
	case <-time.After(wait):
		t.Fatal("real AfterFunc did not fire")
	}

	far := c.AfterFunc(time.Hour, func() { t.Error("stopped timer fired") })
	if !far.Stop() {
		t.Fatal("Stop on an armed real timer = false")
	}
	if far.Stop() {
		t.Fatal("second Stop on a real timer = true")
	}
}
