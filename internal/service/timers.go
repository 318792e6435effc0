package service

import "time"

// timerQueue finds sessions past their TTL without scanning them all. Each
// heartbeat receipt is appended to the FIFO of its session's TTL; receipt
// times only grow (the Service reads each one under its mutex, and the
// clock is monotonic), so within one FIFO deadlines are in order and a scan
// pops from the front until the first deadline still ahead. An entry
// superseded by a later heartbeat of the same session is skipped when
// popped. The one push of an older time, unmarkExpiring's re-push of a
// session's last receipt, sits behind later entries and so pops late,
// never early. Cost: one append per heartbeat, one pop per heartbeat when
// it ages out.
type timerQueue struct {
	byTTL map[time.Duration]*fifo
}

type timerEntry struct {
	id uint64
	at time.Time // receipt time
}

type fifo struct {
	items []timerEntry
	head  int
}

func newTimerQueue() *timerQueue { return &timerQueue{byTTL: make(map[time.Duration]*fifo)} }

func (q *timerQueue) push(id uint64, ttl time.Duration, at time.Time) {
	f := q.byTTL[ttl]
	if f == nil {
		f = &fifo{}
		q.byTTL[ttl] = f
	}
	f.items = append(f.items, timerEntry{id, at})
}

// due calls expired(id, at) for every entry whose receipt at is more than
// its TTL before now, in order, and drops them.
func (q *timerQueue) due(now time.Time, expired func(id uint64, at time.Time)) {
	for ttl, f := range q.byTTL {
		for f.head < len(f.items) && now.Sub(f.items[f.head].at) > ttl {
			e := f.items[f.head]
			f.items[f.head] = timerEntry{}
			f.head++
			expired(e.id, e.at)
		}
		if f.head == len(f.items) {
			f.items, f.head = f.items[:0], 0
		} else if f.head > len(f.items)/2 && f.head > 1024 {
			// Compact once the dead prefix dominates.
			f.items = append(f.items[:0], f.items[f.head:]...)
			f.head = 0
		}
	}
}

func (q *timerQueue) clear() { clear(q.byTTL) }
