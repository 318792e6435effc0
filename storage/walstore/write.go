package walstore

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/server/v3/storage/wal/walpb"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/storage"
)

// Save implements storage.LogStore: st (skipped when nil or empty) and ents
// in one wal.Save, synced before Save returns.
//
// ents must be consecutive and start at or below LastIndex()+1; otherwise
// Save returns an error wrapping storage.ErrNonContiguous and writes nothing.
// Entries at or below the latest snapshot's index (or below FirstIndex) are
// covered by the snapshot and skipped. An entry above it and at or below
// LastIndex() replaces the stored one and every later entry is dropped (the
// WAL appends the new entries; reading it back applies the overwrite).
//
// Every Save ends with a hard state record (once any hard state was saved),
// the current one when st is empty, so that Open can tell a torn final write
// from damage in the middle of the last segment. A Save without entries
// that changes only the commit index (raft.MustSync is false) writes
// nothing: the hard state is kept in memory and becomes the hard state
// record of the next Save. (etcd's wal.Save would write it unsynced; not
// writing it keeps every write synced, which recovery relies on.)
//
// Save keeps the entry pointers in memory and hands them out from Entries:
// the caller must not modify them afterwards (raft never does).
//
// A failed write or sync is returned wrapped (errors.Is finds the cause) and
// is sticky: this and every later write returns it. After Close it returns
// ErrClosed.
func (s *Store) Save(st *raftpb.HardState, ents []*raftpb.Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writable(); err != nil {
		return err
	}
	in, ok, err := storage.PrepareSave("walstore", st, ents, max(s.mem.prevIndex, s.snapMeta.GetIndex()), s.mem.lastIndex(), s.hardState)
	if !ok || err != nil {
		return err
	}
	ents = in.Entries
	hs := s.hardState
	if in.HardState != nil {
		hs = in.HardState
	}
	if in.Deferred {
		// Only the commit index moved: nothing to make durable (raft learns
		// a lost commit index again from the leader). Kept in memory, it is
		// the hard state record of the next Save, which is synced, so every
		// write stays synced (recovery relies on that).
		s.hardState = hs
		s.hsPending = true
		return nil
	}
	if err := s.w.Save(hs, ents); err != nil {
		s.fail(err)
		if len(ents) > 0 {
			return fmt.Errorf("walstore: %s: save entries [%d, %d]: %w", s.dir, ents[0].GetIndex(), ents[len(ents)-1].GetIndex(), err)
		}
		return fmt.Errorf("walstore: %s: save hard state: %w", s.dir, err)
	}
	s.hardState = hs
	s.hsPending = false
	s.mem.append(ents)
	return nil
}

// SaveSnapshot implements storage.LogStore: it writes snap to a new
// snapshot file, records it in the WAL and commits it by replacing META.
//
// When the log holds the entry at snap's index with snap's term (a snapshot
// this replica took), the log is kept: entries at or below snap's index stay
// until Compact. Otherwise (a snapshot received from the leader) the log is
// replaced: the store starts a new WAL holding the hard state (its commit
// index raised to snap's index if it was lower) and the snapshot record,
// commits it in META and removes the old WAL; FirstIndex becomes snap's
// index + 1 and LastIndex snap's index.
//
// It returns raft.ErrSnapOutOfDate when snap's index is at or below that of
// the current snapshot (a snapshot at index 0 is accepted only while the
// current one is at 0 too, to record a bootstrap ConfState), an error for a
// nil snapshot or metadata, and the sticky write error as Save does. A crash
// before META is replaced leaves the previous snapshot current.
func (s *Store) SaveSnapshot(snap *raftpb.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writable(); err != nil {
		return err
	}
	if snap == nil || snap.GetMetadata() == nil {
		return errors.New("walstore: SaveSnapshot: nil snapshot or metadata")
	}
	md := raftpb.EnsureSnapshotMetadata(proto.Clone(snap.GetMetadata()).(*raftpb.SnapshotMetadata))
	index, term := md.GetIndex(), md.GetTerm()
	if cur := s.snapMeta.GetIndex(); (cur != 0 && index <= cur) || index < s.mem.prevIndex {
		return raft.ErrSnapOutOfDate
	}
	t, terr := s.mem.term(index)
	keep := terr == nil && t == term

	name := snapFileName(term, index)
	err := writeFileAtomic(s.dir, name, s.hooks.sync, func(w io.Writer) error {
		return writeSnap(w, &raftpb.Snapshot{Metadata: md, Data: snap.GetData()})
	})
	if err != nil {
		return s.failf(err, "write snapshot file %s", name)
	}
	rec := &walpb.Snapshot{Index: new(index), Term: new(term), ConfState: proto.Clone(md.GetConfState()).(*raftpb.ConfState)}
	m := s.meta
	m.hasSnap, m.snapIndex, m.snapTerm = true, index, term
	oldSnap := ""
	if s.meta.hasSnap && s.meta.snapIndex != index {
		oldSnap = snapFileName(s.meta.snapTerm, s.meta.snapIndex)
	}

	if keep {
		if s.hsPending {
			// The deferred commit-only hard state goes first, synced with
			// the snapshot record: the snapshot's index must never be above
			// the durable commit index.
			if err := s.w.Save(s.hardState, nil); err != nil {
				return s.failf(err, "save hard state before the snapshot at index %d", index)
			}
			s.hsPending = false
		}
		if err := s.w.SaveSnapshot(rec); err != nil {
			return s.failf(err, "record snapshot at index %d in the WAL", index)
		}
		if err := s.writeMeta(m); err != nil {
			return s.failf(err, "commit snapshot at index %d", index)
		}
	} else {
		m.walGen++
		m.prevIndex, m.prevTerm = index, term
		hs := raisedCommit(s.hardState, index)
		w, err := s.newWAL(m.walGen, hs, rec)
		if err != nil {
			return s.failf(err, "start a WAL for the snapshot at index %d", index)
		}
		if err := s.writeMeta(m); err != nil {
			_ = w.Close()
			return s.failf(err, "commit snapshot at index %d", index)
		}
		old := s.w
		s.w = w
		s.hardState = hs
		s.hsPending = false
		s.mem.reset(index, term)
		oldDir := filepath.Join(s.dir, walDirName(s.meta.walGen))
		if err := old.Close(); err != nil {
			s.lg.Warn("walstore: close the replaced WAL", zap.String("dir", oldDir), zap.Error(err))
		}
		s.remove(oldDir)
	}
	s.meta = m
	s.snapMeta = md
	if oldSnap != "" {
		s.remove(filepath.Join(s.dir, oldSnap))
	}
	return nil
}

// newWAL creates WAL generation gen holding the hard state hs (when not
// nil) and the snapshot record rec, synced.
func (s *Store) newWAL(gen uint64, hs *raftpb.HardState, rec *walpb.Snapshot) (*wal.WAL, error) {
	dir := filepath.Join(s.dir, walDirName(gen))
	// A leftover of an earlier failed attempt would make Create fail.
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	w, err := wal.Create(s.lg.Named("wal"), dir, nil)
	if err != nil {
		return nil, err
	}
	if hs != nil {
		if err := w.Save(hs, nil); err != nil {
			_ = w.Close()
			return nil, err
		}
	}
	// SaveSnapshot syncs both records.
	if err := w.SaveSnapshot(rec); err != nil {
		_ = w.Close()
		return nil, err
	}
	return w, nil
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

// Compact implements storage.LogStore: it records the compaction point in the
// WAL (a snapshot record at index, where the WAL is read from on Open),
// commits it in META, drops the entries from memory and deletes the WAL
// segments that hold only compacted entries.
//
// It returns raft.ErrCompacted for an index at or below FirstIndex()-1, an
// error wrapping storage.ErrCompactBeyondSnapshot for an index past the
// latest snapshot, and the sticky write error as Save does; in the first
// two cases it writes nothing.
func (s *Store) Compact(index uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writable(); err != nil {
		return err
	}
	if index <= s.mem.prevIndex {
		return raft.ErrCompacted
	}
	if !s.meta.hasSnap || index > s.meta.snapIndex {
		return fmt.Errorf("walstore: Compact(%d): latest snapshot is at %d: %w",
			index, s.snapMeta.GetIndex(), storage.ErrCompactBeyondSnapshot)
	}
	// The snapshot lies within the log (Open and SaveSnapshot keep it so).
	term, err := s.mem.term(index)
	if err != nil {
		return err
	}
	// The WAL's reader starts at a snapshot record; this one marks where.
	// Its ConfState is required by the WAL and never read back.
	rec := &walpb.Snapshot{Index: new(index), Term: new(term), ConfState: new(raftpb.ConfState)}
	if err := s.w.SaveSnapshot(rec); err != nil {
		return s.failf(err, "record compaction at %d in the WAL", index)
	}
	m := s.meta
	m.prevIndex, m.prevTerm = index, term
	if err := s.writeMeta(m); err != nil {
		return s.failf(err, "commit compaction at %d", index)
	}
	s.meta = m
	s.mem.compact(index, term)
	s.releaseSegments(index)
	return nil
}

// releaseSegments closes and deletes the WAL segments that Open no longer
// reads once the log starts after index: every segment before the last one
// started at or below index. Failures are logged: a segment left behind is
// deleted by a later call.
func (s *Store) releaseSegments(index uint64) {
	if err := s.w.ReleaseLockTo(index + 1); err != nil {
		s.lg.Warn("walstore: release WAL segments", zap.Uint64("index", index), zap.Error(err))
		return
	}
	dir := filepath.Join(s.dir, walDirName(s.meta.walGen))
	segs, err := listSegments(dir)
	if err != nil {
		s.lg.Warn("walstore: list WAL segments", zap.String("dir", dir), zap.Error(err))
		return
	}
	from, ok := readFrom(segs, index)
	if !ok {
		return
	}
	for _, sg := range segs {
		if sg.seq >= from[0].seq {
			break
		}
		s.remove(filepath.Join(dir, sg.name))
		_ = os.Remove(filepath.Join(dir, sg.name+".broken"))
	}
}

// SetIdentity implements storage.LogStore: it records id in META, does
// nothing when id is already recorded, and returns an error wrapping
// storage.ErrIdentityMismatch (naming both identities) when another is.
func (s *Store) SetIdentity(id storage.Identity) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writable(); err != nil {
		return err
	}
	if s.meta.hasIdentity {
		if cur := s.meta.identity; cur != id {
			return fmt.Errorf("walstore: %s: recorded cluster %x member %x, asked for cluster %x member %x: %w",
				s.dir, cur.ClusterID, cur.MemberID, id.ClusterID, id.MemberID, storage.ErrIdentityMismatch)
		}
		return nil
	}
	m := s.meta
	m.hasIdentity, m.identity = true, id
	if err := s.writeMeta(m); err != nil {
		return s.failf(err, "save identity")
	}
	s.meta = m
	return nil
}

// writeMeta replaces META with m, atomically and durably.
func (s *Store) writeMeta(m meta) error {
	return writeFileAtomic(s.dir, metaName, s.hooks.sync, func(w io.Writer) error {
		_, err := w.Write(m.encode())
		return err
	})
}

// remove deletes path (a file or directory) that the committed META no
// longer names; a failure is only logged. It does not sync the directory: if
// the removal is lost in a crash, Open removes the leftover again.
func (s *Store) remove(path string) {
	if err := os.RemoveAll(path); err != nil {
		s.lg.Warn("walstore: remove", zap.String("path", path), zap.Error(err))
	}
}

// writable returns the error every write must return now: ErrClosed or the
// sticky failure. s.mu must be held for writing.
func (s *Store) writable() error {
	if s.closed {
		return ErrClosed
	}
	return s.failed
}

// fail records err as the sticky write error. s.mu must be held for writing.
func (s *Store) fail(err error) {
	if s.failed == nil {
		s.failed = err
	}
	s.lg.Error("walstore: write failed; the store refuses further writes", zap.String("dir", s.dir), zap.Error(err))
}

// failf records err as the sticky write error and returns it wrapped with
// what the store was doing.
func (s *Store) failf(err error, format string, args ...any) error {
	s.fail(err)
	return fmt.Errorf("walstore: %s: %s: %w", s.dir, fmt.Sprintf(format, args...), err)
}
