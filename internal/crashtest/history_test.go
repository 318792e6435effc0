package crashtest

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
)

// grant is one grant of a lock as its holder saw it. learned and released
// are readings of the history's logical clock: when the holder first knew
// the token, and when it first sent the release.
type grant struct {
	name     string
	session  uint64
	token    uint64
	learned  uint64
	released uint64 // 0 while held
}

// history collects every acknowledged grant and every anomaly.
type history struct {
	now atomic.Uint64

	mu     sync.Mutex
	grants []*grant
	errs   []string
}

func (h *history) tick() uint64 { return h.now.Add(1) }

func (h *history) learn(name string, session, token uint64) *grant {
	g := &grant{name: name, session: session, token: token}
	h.mu.Lock()
	defer h.mu.Unlock()
	g.learned = h.tick()
	h.grants = append(h.grants, g)
	return g
}

func (h *history) releasing(g *grant) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if g.released == 0 {
		g.released = h.tick()
	}
}

// grantsSince returns how many grants were learned after logical time t.
func (h *history) grantsSince(t uint64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, g := range h.grants {
		if g.learned > t {
			n++
		}
	}
	return n
}

func (h *history) anomaly(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.errs = append(h.errs, fmt.Sprintf(format, args...))
}

func (h *history) anomalies() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.errs)
}

// check verifies the grants of each lock in the order their holders learned
// them: each was released before the next was learned (never two holders
// at once), and tokens strictly increase (no token issued twice, none
// going back), across every crash and restart.
func (h *history) check() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	byName := make(map[string][]*grant)
	for _, g := range h.grants {
		byName[g.name] = append(byName[g.name], g)
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		gs := byName[name]
		slices.SortFunc(gs, func(a, b *grant) int { return cmp.Compare(a.learned, b.learned) })
		for i := 1; i < len(gs); i++ {
			prev, g := gs[i-1], gs[i]
			if g.token <= prev.token {
				out = append(out, fmt.Sprintf("lock %q: session %d learned token %d (t%d) after session %d learned token %d (t%d): tokens must strictly increase",
					name, g.session, g.token, g.learned, prev.session, prev.token, prev.learned))
			}
			if prev.released == 0 || prev.released > g.learned {
				out = append(out, fmt.Sprintf("lock %q: session %d learned token %d (t%d) while session %d held token %d (learned t%d, release sent t%d)",
					name, g.session, g.token, g.learned, prev.session, prev.token, prev.learned, prev.released))
			}
		}
	}
	return out
}
