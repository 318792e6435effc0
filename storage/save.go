package storage

import (
	"fmt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// SaveInput is a Save call's arguments checked and trimmed the way every
// backend must (see LogStore.Save).
type SaveInput struct {
	// HardState is a copy of the non-empty hard state to write, or nil.
	HardState *raftpb.HardState
	// Entries are the entries to write: those at or below the covered
	// index dropped.
	Entries []*raftpb.Entry
	// Deferred: the hard state only moves the commit index past prev and
	// there are no entries (raft.MustSync is false). The backend keeps it
	// in memory and writes it with its next write, so that every write it
	// makes is synced.
	Deferred bool
}

// PrepareSave checks a Save's arguments for a backend named backend (for
// error messages) whose entries up to covered are in the snapshot or
// compacted, whose last index is last and whose current hard state is prev
// (nil: none yet). Every entry must be non-nil (an error naming the entry
// otherwise, wrapping neither sentinel), the entries consecutive and, once
// trimmed, starting at or below last+1 (ErrNonContiguous otherwise), and a
// hard state must not commit past the last index the Save leaves, unless
// the commit is covered (ErrCommitBeyondLog otherwise). On an error the
// backend must write nothing.
// ok is false when there is nothing to write at all.
func PrepareSave(backend string, st *raftpb.HardState, ents []*raftpb.Entry, covered, last uint64, prev *raftpb.HardState) (in SaveInput, ok bool, err error) {
	for k, e := range ents {
		if e == nil {
			return in, false, fmt.Errorf("%s: Save: entry %d of %d is nil", backend, k, len(ents))
		}
		if want := ents[0].GetIndex() + uint64(k); e.GetIndex() != want {
			return in, false, fmt.Errorf("%s: Save: entry %d of %d has index %d, want %d: %w",
				backend, k, len(ents), e.GetIndex(), want, ErrNonContiguous)
		}
	}
	if len(ents) > 0 && ents[0].GetIndex() <= covered {
		ents = ents[min(covered+1-ents[0].GetIndex(), uint64(len(ents))):]
	}
	if len(ents) > 0 && ents[0].GetIndex() > last+1 {
		return in, false, fmt.Errorf("%s: Save: entries start at %d after last index %d: %w",
			backend, ents[0].GetIndex(), last, ErrNonContiguous)
	}
	if raft.IsEmptyHardState(st) {
		return SaveInput{Entries: ents}, len(ents) > 0, nil
	}
	after := last // the last index once ents are written
	if len(ents) > 0 {
		after = ents[len(ents)-1].GetIndex()
	}
	if c := st.GetCommit(); c > after && c > covered {
		return in, false, fmt.Errorf("%s: Save: hard state commits index %d past the last index %d: %w",
			backend, c, after, ErrCommitBeyondLog)
	}
	hs := proto.Clone(st).(*raftpb.HardState)
	if prev == nil {
		prev = new(raftpb.HardState)
	}
	return SaveInput{HardState: hs, Entries: ents, Deferred: len(ents) == 0 && !raft.MustSync(hs, prev, 0)}, true, nil
}
