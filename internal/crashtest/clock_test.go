package crashtest

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quorumlock/quorumlock/clock"
)

// stepClock is a clock.Manual that remembers its tickers, so that tick can
// wait until every running node has taken a tick before the next one: a
// node starved of CPU (-race, a loaded machine) then does not fall many
// ticks behind and see elections that the others did not.
type stepClock struct {
	*clock.Manual
	mu      sync.Mutex
	tickers []*stepTicker
}

type stepTicker struct {
	clock.Ticker
	stopped atomic.Bool
}

func (t *stepTicker) Stop() {
	t.stopped.Store(true)
	t.Ticker.Stop()
}

func (c *stepClock) NewTicker(d time.Duration) clock.Ticker {
	t := &stepTicker{Ticker: c.Manual.NewTicker(d)}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tickers = slices.DeleteFunc(c.tickers, func(t *stepTicker) bool { return t.stopped.Load() })
	c.tickers = append(c.tickers, t)
	return t
}

// tick advances one tick and waits a bounded while (a node may be held at
// a failpoint) until every running node has taken it.
func (c *stepClock) tick() {
	c.Advance(testTick)
	c.mu.Lock()
	tickers := slices.Clone(c.tickers)
	c.mu.Unlock()
	deadline := time.Now().Add(20 * time.Millisecond)
	for _, t := range tickers {
		for !t.stopped.Load() && len(t.C()) > 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Microsecond)
		}
	}
}
