package pebblestore

import (
	"go.etcd.io/raft/v3/raftpb"
)

// cacheLimits bound the tail cache. Both limits apply; the cache may hold zero
// entries when a single entry exceeds maxBytes.
type cacheLimits struct {
	maxEntries int // entries kept, >= 0
	maxBytes   int // sum of marshalled entry sizes kept, >= 0
}

// defaultCacheLimits keep the tail that raft reads while replicating to
// followers that are slightly behind: a few thousand entries, at most 16 MiB.
var defaultCacheLimits = cacheLimits{maxEntries: 4096, maxBytes: 16 << 20}

// tailCache holds the most recent log entries, a contiguous suffix of the log:
// ents[k] has index first+k and the last cached entry is the last entry of
// the log. An empty cache has first == lastIndex+1.
//
// Entries are immutable once saved and shared with callers of Entries, so the
// cache never writes through a pointer it holds; it only drops and appends
// pointers.
type tailCache struct {
	lim   cacheLimits
	first uint64
	ents  []*raftpb.Entry
	sizes []int // marshalled size of each entry, parallel to ents
	bytes int   // sum of sizes
}

func newTailCache(lim cacheLimits, first uint64) *tailCache {
	return &tailCache{lim: lim, first: first}
}

// get returns the entry with index i, or nil if it is not cached.
func (c *tailCache) get(i uint64) *raftpb.Entry {
	if i < c.first || i-c.first >= uint64(len(c.ents)) {
		return nil
	}
	return c.ents[i-c.first]
}

// size returns the marshalled size of the cached entry i; i must be cached.
func (c *tailCache) size(i uint64) int {
	return c.sizes[i-c.first]
}

// truncateFrom drops every entry with index >= i. When i is below the cached
// range the cache becomes empty and starts at i.
func (c *tailCache) truncateFrom(i uint64) {
	if i <= c.first {
		c.reset(i)
		return
	}
	n := i - c.first
	if n >= uint64(len(c.ents)) {
		return
	}
	for k := n; k < uint64(len(c.ents)); k++ {
		c.bytes -= c.sizes[k]
		c.ents[k] = nil
	}
	c.ents = c.ents[:n]
	c.sizes = c.sizes[:n]
}

// dropThrough drops every entry with index <= i. When i is at or past the
// cached range the cache becomes empty and starts at i+1.
func (c *tailCache) dropThrough(i uint64) {
	if i < c.first {
		return
	}
	n := i - c.first + 1
	if n >= uint64(len(c.ents)) {
		c.reset(i + 1)
		return
	}
	c.popFront(int(n))
}

// reset empties the cache; the next appended entry must have index first.
func (c *tailCache) reset(first uint64) {
	clear(c.ents)
	c.ents = c.ents[:0]
	c.sizes = c.sizes[:0]
	c.bytes = 0
	c.first = first
}

// append adds e, whose index must be first+len(ents), and evicts the oldest
// entries beyond the limits.
func (c *tailCache) append(e *raftpb.Entry, size int) {
	c.ents = append(c.ents, e)
	c.sizes = append(c.sizes, size)
	c.bytes += size
	n, bytes := 0, c.bytes
	for len(c.ents)-n > c.lim.maxEntries || (bytes > c.lim.maxBytes && n < len(c.ents)) {
		bytes -= c.sizes[n]
		n++
	}
	if n > 0 {
		c.popFront(n)
	}
}

// popFront drops the n oldest entries. Reslicing keeps the backing array;
// append reallocates once it is full and copies only the live entries, so the
// memory held stays proportional to the limits.
func (c *tailCache) popFront(n int) {
	for k := 0; k < n; k++ {
		c.bytes -= c.sizes[k]
	}
	clear(c.ents[:n])
	c.ents = c.ents[n:]
	c.sizes = c.sizes[n:]
	c.first += uint64(n)
}
