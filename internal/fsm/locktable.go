package fsm

import (
	"iter"
	"maps"
)

// lockShards is the number of shards of a lockTable: enough that cloning
// one (lockShards-th of the table) is cheap, few enough that an empty table
// is small.
const lockShards = 256

// lockTable maps lock names to held locks. It is sharded so that a snapshot
// can freeze it in O(shards) and keep reading it from another goroutine
// while apply goes on: a frozen shard is shared with the snapshot and is
// copied on its first write (copy-on-write at shard granularity), so apply
// never pauses for more than one shard's copy, and a snapshot's view never
// changes under it. The shard of a name is a fixed hash; it affects no
// result (iteration order is never observable: callers sort).
type lockTable struct {
	shards [lockShards]*lockShard
	n      int
}

type lockShard struct {
	m map[string]lock
	// frozen: a snapshot reads m; clone before writing.
	frozen bool
}

func newLockTable() *lockTable { return newLockTableSized(0) }

// newLockTableSized returns a table with room for about n locks.
func newLockTableSized(n int) *lockTable {
	t := &lockTable{}
	per := 0
	if n > 0 {
		per = n/lockShards + n/lockShards/8 + 1
	}
	for i := range t.shards {
		t.shards[i] = &lockShard{m: make(map[string]lock, per)}
	}
	return t
}

// shardOf is FNV-1a (32 bit) of name, reduced to a shard index.
func shardOf(name string) int {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h ^= uint32(name[i])
		h *= 16777619
	}
	return int(h % lockShards)
}

func (t *lockTable) lookup(name string) (lock, bool) {
	l, ok := t.shards[shardOf(name)].m[name]
	return l, ok
}

func (t *lockTable) get(name string) lock { return t.shards[shardOf(name)].m[name] }

// writable returns the shard of name, copying it first if it is frozen.
func (t *lockTable) writable(name string) *lockShard {
	i := shardOf(name)
	s := t.shards[i]
	if s.frozen {
		s = &lockShard{m: maps.Clone(s.m)}
		t.shards[i] = s
	}
	return s
}

func (t *lockTable) set(name string, l lock) {
	s := t.writable(name)
	if _, ok := s.m[name]; !ok {
		t.n++
	}
	s.m[name] = l
}

func (t *lockTable) del(name string) {
	if _, ok := t.lookup(name); !ok {
		return
	}
	delete(t.writable(name).m, name)
	t.n--
}

func (t *lockTable) len() int { return t.n }

// all yields every held lock, in no particular order.
func (t *lockTable) all() iter.Seq2[string, lock] {
	return func(yield func(string, lock) bool) {
		for _, s := range t.shards {
			for name, l := range s.m {
				if !yield(name, l) {
					return
				}
			}
		}
	}
}

// freeze marks every shard shared and returns the shards' maps: a view of
// the table as it is now that later writes leave untouched, safe to read
// from another goroutine.
func (t *lockTable) freeze() []map[string]lock {
	out := make([]map[string]lock, len(t.shards))
	for i, s := range t.shards {
		s.frozen = true
		out[i] = s.m
	}
	return out
}
