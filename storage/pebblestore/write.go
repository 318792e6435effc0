package pebblestore

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/storage"
)

// Save implements storage.LogStore: st (skipped when nil or empty) and ents in
// one Pebble batch committed with one fsync.
//
// ents must be consecutive and start at or below LastIndex()+1; otherwise
// Save returns an error wrapping storage.ErrNonContiguous and writes nothing.
// Entries at or below the latest snapshot's index (or below FirstIndex) are
// covered by the snapshot and skipped. An entry above it and at or below
// LastIndex() replaces the stored one and every later entry is deleted.
//
// Save keeps the entry pointers in its cache and hands them out from Entries:
// the caller must not modify them afterwards (raft never does).
//
// A failed commit or fsync is returned wrapped (errors.Is finds the cause) and
// is sticky: this and every later write returns it. After Close it returns
// ErrClosed.
func (s *Store) Save(st *raftpb.HardState, ents []*raftpb.Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writable(); err != nil {
		return err
	}
	in, ok, err := storage.PrepareSave("pebblestore", st, ents, max(s.trunc.index, s.snapMeta.GetIndex()), s.lastIndex, s.hardState)
	if !ok || err != nil {
		return err
	}
	hs, ents := in.HardState, in.Entries
	if in.Deferred {
		// Only the commit index moved: kept in memory and written with the
		// next write, so that every write stays one synced batch (the WAL
		// check on open relies on only the last record being possibly
		// incomplete). A commit index lost in a crash is learnt again from
		// the leader.
		s.hardState = hs
		s.hsPending = true
		return nil
	}
	if hs == nil && s.hsPending {
		hs = s.hardState
	}
	var first, last uint64
	if len(ents) > 0 {
		first = ents[0].GetIndex()
		last = first + uint64(len(ents)) - 1
	}
	s.sizes = s.sizes[:0]
	err = s.write(func(b *pebble.Batch) error {
		if hs != nil {
			v, err := proto.Marshal(hs)
			if err != nil {
				return fmt.Errorf("marshal hard state: %w", err)
			}
			if err := b.Set(keyHardState, v, nil); err != nil {
				return err
			}
		}
		if len(ents) == 0 {
			return nil
		}
		if last < s.lastIndex {
			// Log matching: the entries after the overwritten ones belong to
			// the replaced suffix.
			if err := b.DeleteRange(entryKey(last+1), entryKeyUpper(s.lastIndex), nil); err != nil {
				return err
			}
		}
		var key [9]byte
		key[0] = prefixEntry
		for _, e := range ents {
			var err error
			s.buf, err = proto.MarshalOptions{}.MarshalAppend(s.buf[:0], e)
			if err != nil {
				return fmt.Errorf("marshal entry %d: %w", e.GetIndex(), err)
			}
			binary.BigEndian.PutUint64(key[1:], e.GetIndex())
			if err := b.Set(key[:], s.buf, nil); err != nil {
				return err
			}
			s.sizes = append(s.sizes, len(s.buf))
		}
		return nil
	})
	if err != nil {
		if len(ents) > 0 {
			return fmt.Errorf("pebblestore: %s: save entries [%d, %d]: %w", s.dir, first, last, err)
		}
		return fmt.Errorf("pebblestore: %s: save hard state: %w", s.dir, err)
	}

	if hs != nil {
		s.hardState = hs
		s.hsPending = false
	}
	if len(ents) > 0 {
		s.cache.truncateFrom(first)
		for k, e := range ents {
			s.cache.append(e, s.sizes[k])
		}
		s.lastIndex = last
	}
	s.shrinkScratch()
	return nil
}

// SaveSnapshot implements storage.LogStore: it durably records snap as the
// latest snapshot (metadata and data) in one synced batch.
//
// When the log holds the entry at snap's index with snap's term (a snapshot
// this replica took), the log is kept: entries at or below snap's index stay
// until Compact. Otherwise (a snapshot received from the leader) the log
// cannot be trusted to match and every entry is discarded in the same batch:
// FirstIndex becomes snap's index + 1 and LastIndex snap's index, and the
// hard state's commit index is raised to snap's index if it was lower.
//
// It returns raft.ErrSnapOutOfDate when snap's index is at or below that of
// the current snapshot (a snapshot at index 0 is accepted only while the
// current one is at 0 too, to record a bootstrap ConfState), an error for a
// nil snapshot or metadata, and the sticky write error as Save does.
func (s *Store) SaveSnapshot(snap *raftpb.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writable(); err != nil {
		return err
	}
	if snap == nil || snap.GetMetadata() == nil {
		return errors.New("pebblestore: SaveSnapshot: nil snapshot or metadata")
	}
	meta := raftpb.EnsureSnapshotMetadata(proto.Clone(snap.GetMetadata()).(*raftpb.SnapshotMetadata))
	index, term := meta.GetIndex(), meta.GetTerm()
	if cur := s.snapMeta.GetIndex(); (cur != 0 && index <= cur) || index < s.trunc.index {
		return raft.ErrSnapOutOfDate
	}
	keep := false
	if index <= s.lastIndex {
		t, err := s.term(index)
		if err != nil {
			return err
		}
		keep = t == term
	}

	mv, err := proto.Marshal(meta)
	if err != nil {
		return fmt.Errorf("pebblestore: SaveSnapshot: marshal metadata: %w", err)
	}
	// The hard state goes into the same batch when it changes (a leader's
	// snapshot raises the commit index) or a commit-only change is pending:
	// the snapshot's index must never be above the durable commit index.
	hs := s.hardState
	if !keep {
		hs = raisedCommit(hs, index)
	}
	var hv []byte
	if hs != s.hardState || s.hsPending {
		if hv, err = proto.Marshal(hs); err != nil {
			return fmt.Errorf("pebblestore: SaveSnapshot: marshal hard state: %w", err)
		}
	}
	err = s.write(func(b *pebble.Batch) error {
		if err := b.Set(keySnapMeta, mv, nil); err != nil {
			return err
		}
		var err error
		if len(snap.GetData()) > 0 {
			err = b.Set(keySnapData, snap.GetData(), nil)
		} else {
			err = b.Delete(keySnapData, nil)
		}
		if err != nil {
			return err
		}
		if hv != nil {
			if err := b.Set(keyHardState, hv, nil); err != nil {
				return err
			}
		}
		if keep {
			return nil
		}
		if err := b.Set(keyTrunc, encodePair(index, term), nil); err != nil {
			return err
		}
		return b.DeleteRange(entryKeysStart, entryKeysEnd, nil)
	})
	if err != nil {
		return fmt.Errorf("pebblestore: %s: save snapshot at index %d: %w", s.dir, index, err)
	}

	s.snapMeta = meta
	if hv != nil {
		s.hardState = hs
		s.hsPending = false
	}
	if !keep {
		s.trunc = truncState{index: index, term: term}
		s.lastIndex = index
		s.cache.reset(index + 1)
	}
	return nil
}

// raisedCommit returns hs with its commit index raised to index, a copy when
// it changes anything (hs itself otherwise; nil stays nil for index 0).
func raisedCommit(hs *raftpb.HardState, index uint64) *raftpb.HardState {
	if hs.GetCommit() >= index {
		return hs
	}
	out := new(raftpb.HardState)
	if hs != nil {
		out = proto.Clone(hs).(*raftpb.HardState)
	}
	out.Commit = new(index)
	return out
}

// Compact implements storage.LogStore: it deletes the entries up to and
// including index and records index and its term as the truncated state, in
// one synced batch.
//
// It returns raft.ErrCompacted for an index at or below FirstIndex()-1, an
// error wrapping storage.ErrCompactBeyondSnapshot for an index past the
// latest snapshot, and the sticky write error as Save does; in all three
// cases it writes nothing.
func (s *Store) Compact(index uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writable(); err != nil {
		return err
	}
	if index <= s.trunc.index {
		return raft.ErrCompacted
	}
	if index > s.snapMeta.GetIndex() {
		return fmt.Errorf("pebblestore: Compact(%d): latest snapshot is at %d: %w",
			index, s.snapMeta.GetIndex(), storage.ErrCompactBeyondSnapshot)
	}
	// The snapshot lies within the log (load and SaveSnapshot keep it so),
	// so index is a stored entry.
	term, err := s.term(index)
	if err != nil {
		return err
	}
	err = s.write(func(b *pebble.Batch) error {
		if err := b.Set(keyTrunc, encodePair(index, term), nil); err != nil {
			return err
		}
		return b.DeleteRange(entryKeysStart, entryKeyUpper(index), nil)
	})
	if err != nil {
		return fmt.Errorf("pebblestore: %s: compact through index %d: %w", s.dir, index, err)
	}
	s.trunc = truncState{index: index, term: term}
	s.cache.dropThrough(index)
	return nil
}

// SetIdentity implements storage.LogStore: it records id with a synced write,
// does nothing when id is already recorded, and returns an error wrapping
// storage.ErrIdentityMismatch (naming both identities) when another is.
func (s *Store) SetIdentity(id storage.Identity) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writable(); err != nil {
		return err
	}
	cur, ok, err := s.identity()
	if err != nil {
		return err
	}
	if ok {
		if cur == id {
			return nil
		}
		return fmt.Errorf("pebblestore: %s: recorded cluster %x member %x, asked for cluster %x member %x: %w",
			s.dir, cur.ClusterID, cur.MemberID, id.ClusterID, id.MemberID, storage.ErrIdentityMismatch)
	}
	err = s.write(func(b *pebble.Batch) error {
		return b.Set(keyIdentity, encodePair(id.ClusterID, id.MemberID), nil)
	})
	if err != nil {
		return fmt.Errorf("pebblestore: %s: save identity: %w", s.dir, err)
	}
	return nil
}

// writable returns the error every write must return now: ErrClosed or the
// sticky failure. s.mu must be held for writing.
func (s *Store) writable() error {
	if s.closed {
		return ErrClosed
	}
	if s.failed == nil {
		if err := s.fatalErr(); err != nil {
			s.failed = err
		}
	}
	return s.failed
}

// write builds a batch with build and commits it with one fsync. An error
// from build aborts the batch and leaves the store as it was. Any commit
// failure is recorded as the sticky write error: once Pebble's WAL failed,
// what reached the disk is unknown (and Pebble panics on later WAL writes).
func (s *Store) write(build func(b *pebble.Batch) error) error {
	b := s.db.NewBatch()
	if err := build(b); err != nil {
		_ = b.Close()
		return err
	}
	err := s.db.ApplyNoSyncWait(b, pebble.Sync)
	if err == nil {
		if err = s.fatalErr(); err != nil {
			// Pebble reports a commit that failed before reaching the WAL
			// through Logger.Fatalf and returns nil; waiting for the sync
			// would never end. b is not closed: if it did reach the WAL, the
			// WAL still refers to it and it must not go back to Pebble's pool.
			s.fail(err)
			return err
		}
		err = b.SyncWait()
		if err == nil {
			// A WAL write or sync failure reaches the store, not Pebble
			// (walFile): the commit looks synced but is not acknowledged.
			err = s.brokenErr()
		}
	}
	_ = b.Close()
	if err != nil {
		s.fail(err)
	}
	return err
}

// fail records err as the sticky write error. s.mu must be held for writing.
func (s *Store) fail(err error) {
	if s.failed == nil {
		s.failed = err
	}
	s.markBroken(err)
	s.log.Error("pebblestore: write failed; the store refuses further writes",
		zap.String("dir", s.dir), zap.Error(err))
}

// shrinkScratch drops scratch buffers a large Save grew, so that one big batch
// does not pin its memory for the life of the store.
func (s *Store) shrinkScratch() {
	const keep = 1 << 20
	if cap(s.buf) > keep {
		s.buf = nil
	}
	if cap(s.sizes) > keep/8 {
		s.sizes = nil
	}
}
