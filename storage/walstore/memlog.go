package walstore

import (
	"slices"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// memLog is the retained raft log in memory, the index that reads are served
// from (the WAL is append-only and is read back only on Open), as etcd keeps
// its log in a raft.MemoryStorage.
//
// Entries are immutable once saved and shared with callers of slice, which
// get their own slice: memLog only drops and appends pointers.
type memLog struct {
	// prevIndex and prevTerm describe the entry just before the first
	// retained one: the last compacted entry, or the snapshot that replaced
	// the log.
	prevIndex, prevTerm uint64
	ents                []*raftpb.Entry // ents[k] has index prevIndex+1+k
	sizes               []uint64        // marshalled size of ents[k]
}

func (l *memLog) firstIndex() uint64 { return l.prevIndex + 1 }

func (l *memLog) lastIndex() uint64 { return l.prevIndex + uint64(len(l.ents)) }

// term is raft.Storage.Term.
func (l *memLog) term(i uint64) (uint64, error) {
	switch {
	case i < l.prevIndex:
		return 0, raft.ErrCompacted
	case i == l.prevIndex:
		return l.prevTerm, nil
	case i > l.lastIndex():
		return 0, raft.ErrUnavailable
	}
	return l.ents[i-l.prevIndex-1].GetTerm(), nil
}

// slice returns a new slice of the entries in [lo, hi), firstIndex() <= lo <
// hi <= lastIndex()+1, cut after the first entry that brings their total
// size past maxSize (at least one entry).
func (l *memLog) slice(lo, hi, maxSize uint64) []*raftpb.Entry {
	from, to := lo-l.prevIndex-1, hi-l.prevIndex-1
	n, total := from, uint64(0)
	for ; n < to; n++ {
		total += l.sizes[n]
		if n > from && total > maxSize {
			break
		}
	}
	return slices.Clone(l.ents[from:n])
}

// append adds ents, whose first index is in [firstIndex(), lastIndex()+1],
// replacing the entries from that index on.
func (l *memLog) append(ents []*raftpb.Entry) {
	if len(ents) == 0 {
		return
	}
	off := ents[0].GetIndex() - l.prevIndex - 1
	clear(l.ents[off:])
	l.ents = l.ents[:off]
	l.sizes = l.sizes[:off]
	for _, e := range ents {
		l.ents = append(l.ents, e)
		l.sizes = append(l.sizes, uint64(proto.Size(e)))
	}
}

// compact drops the entries up to and including index, a retained entry,
// whose term is term.
func (l *memLog) compact(index, term uint64) {
	n := index - l.prevIndex
	// Copy what remains so that the dropped entries' memory is released.
	l.ents = slices.Clone(l.ents[n:])
	l.sizes = slices.Clone(l.sizes[n:])
	l.prevIndex, l.prevTerm = index, term
}

// reset empties the log, which continues after index with term term.
func (l *memLog) reset(index, term uint64) {
	l.ents, l.sizes = nil, nil
	l.prevIndex, l.prevTerm = index, term
}
