// Package walstore is a storage.LogStore on etcd's write-ahead log
// (go.etcd.io/etcd/server/v3/storage/wal) plus snapshot files: the
// alternative to the default storage/pebblestore, for deployments that want
// the log format etcd has run on for years.
//
// The WAL holds the hard state and the log entries; each Save is one
// wal.Save, which fsyncs. Snapshots are files of their own, checksummed and
// written atomically, and are also recorded in the WAL (wal.SaveSnapshot), as
// etcd does. A small checksummed META file, replaced atomically, records the
// identity, which snapshot file is current, how far the log was compacted and
// which WAL directory is live; replacing it is the commit point of
// SaveSnapshot and Compact. docs/storage.md shows the layout.
//
// The WAL is append-only, so reads are served from memory, as etcd serves
// them from raft.MemoryStorage: Open reads the retained log back into memory
// and Compact drops it again (and deletes WAL segments it no longer needs).
// The memory held is the retained log: the snapshot interval plus the
// catch-up tail kept behind a snapshot.
//
// A failed write or sync is sticky: the failing call returns the error and
// every later write returns it too, because an fsync failure may have
// dropped written pages and retrying could acknowledge data that is not on
// disk. Reads keep answering from memory, which holds only what was written
// successfully.
//
// etcd's WAL preallocates 64 MB segments (wal.SegmentSizeBytes, a variable of
// that package) and writes through os files directly: it has no file system
// abstraction, so crash and fault tests of this package work on real files.
package walstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/storage"
)

// ErrClosed is returned by every method of a Store after Close.
var ErrClosed = errors.New("walstore: store is closed")

// Options configure Open. The zero value is ready to use.
type Options struct {
	// Logger receives the WAL's messages and the store's own (repairs,
	// failed writes). The default (nil) discards them.
	Logger *zap.Logger
}

// hooks let tests inject faults where the store itself syncs files.
type hooks struct {
	// sync makes a file or directory durable. The default is (*os.File).Sync.
	sync func(*os.File) error
}

const lockName = "LOCK"

// Store is a storage.LogStore on etcd's WAL. Create one with Open.
//
// All methods are safe for concurrent use; writes are serialized and a read
// never observes a partly applied write. Close must be the last call.
type Store struct {
	dir   string
	lg    *zap.Logger
	hooks hooks
	lock  *fileutil.LockedFile // LOCK, held while the store is open

	mu        sync.RWMutex
	closed    bool
	failed    error    // sticky write failure; nil while healthy
	w         *wal.WAL // the live WAL, in directory walDirName(meta.walGen)
	meta      meta     // the durable META
	hardState *raftpb.HardState
	hsPending bool                     // hardState (a commit-only change) is not in the WAL yet
	snapMeta  *raftpb.SnapshotMetadata // latest snapshot's metadata, never nil
	mem       memLog
}

var _ storage.LogStore = (*Store)(nil)

// Open opens the store in dir, creating dir and an empty store when missing,
// and reads it into memory: META, the current snapshot file (checked, then
// dropped: Snapshot reads it again), and the WAL from the first retained
// entry on.
//
// Recovery: a torn final WAL record (cut short, or with a zeroed sector, in
// the last segment, with no later write after it) is truncated away, as
// etcd's wal.Repair does, after keeping a copy of the segment as
// <segment>.broken. Leftovers of a write that crashed before its commit
// point (temporary files, a snapshot file or WAL directory that META does not
// name) are removed. Anything else that fails its checks makes Open fail
// with an error wrapping storage.ErrCorrupt that names the file: a damaged
// or missing META or snapshot file, a WAL record in the middle of the log
// that fails its CRC or does not decode, a missing segment, or records that
// disagree (for example a hard state committing past the last entry).
//
// Once everything checks, Open replaces META with itself (synced), and it
// creates and removes a file in the WAL directory, so that a store in a
// directory it cannot write (permissions, a read-only or full file system)
// fails Open, rather than at its first snapshot or segment cut later.
//
// Open also fails when another Store has dir open (the LOCK file). The
// caller owns the returned Store and must Close it.
func Open(dir string, opts Options) (*Store, error) {
	return open(dir, opts, hooks{})
}

func open(dir string, opts Options, h hooks) (*Store, error) {
	if dir == "" {
		return nil, errors.New("walstore: empty directory name")
	}
	lg := opts.Logger
	if lg == nil {
		lg = zap.NewNop()
	}
	if h.sync == nil {
		h.sync = (*os.File).Sync
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("walstore: create %s: %w", dir, err)
	}
	lock, err := fileutil.TryLockFile(filepath.Join(dir, lockName), os.O_WRONLY|os.O_CREATE, fileutil.PrivateFileMode)
	if err != nil {
		return nil, fmt.Errorf("walstore: lock %s (is another store using it?): %w", dir, err)
	}
	s := &Store{dir: dir, lg: lg, hooks: h, lock: lock}
	if err := s.load(); err != nil {
		if s.w != nil {
			_ = s.w.Close()
		}
		_ = lock.Close()
		return nil, err
	}
	return s, nil
}

// load reads the store into memory, or creates it when META is missing.
func (s *Store) load() error {
	metaPath := filepath.Join(s.dir, metaName)
	b, err := os.ReadFile(metaPath)
	if errors.Is(err, os.ErrNotExist) {
		return s.create()
	}
	if err != nil {
		return fmt.Errorf("walstore: read %s: %w", metaPath, err)
	}
	m, err := decodeMeta(b)
	if err != nil {
		return corrupt(metaPath, err)
	}
	s.meta = m

	s.snapMeta = raftpb.EnsureSnapshotMetadata(nil)
	if m.hasSnap {
		snap, err := readSnap(filepath.Join(s.dir, snapFileName(m.snapTerm, m.snapIndex)), m.snapIndex, m.snapTerm)
		if err != nil {
			return err
		}
		s.snapMeta = snap.GetMetadata()
	}
	s.removeLeftovers()

	walDir := filepath.Join(s.dir, walDirName(m.walGen))
	if _, err := os.Stat(walDir); errors.Is(err, os.ErrNotExist) {
		return corrupt(walDir, fmt.Errorf("the WAL named by %s: %w", metaName, err))
	} else if err != nil {
		return fmt.Errorf("walstore: %s: %w", walDir, err)
	}
	// etcd's WAL creates its next segment in walDir in the background and
	// only reports a failure when it cuts to it: a directory it may not
	// write (permissions, a read-only mount) is refused now, rather than
	// stopping the replica at its first segment cut.
	if err := probeWritable(walDir); err != nil {
		return fmt.Errorf("walstore: %s: cannot write the WAL directory: %w", walDir, err)
	}
	w, hs, ents, err := openWAL(s.lg.Named("wal"), walDir, m.prevIndex, m.prevTerm)
	if err != nil {
		return err
	}
	s.w = w
	s.mem.reset(m.prevIndex, m.prevTerm)
	if len(ents) > 0 && ents[0].GetIndex() != m.prevIndex+1 {
		return corrupt(walDir, fmt.Errorf("log starts at %d, want %d", ents[0].GetIndex(), m.prevIndex+1))
	}
	s.mem.append(ents)
	if !raft.IsEmptyHardState(hs) {
		s.hardState = hs
	}
	s.releaseSegments(m.prevIndex)

	last := s.mem.lastIndex()
	if c := s.hardState.GetCommit(); c > last {
		return corrupt(walDir, fmt.Errorf("hard state commits %d, past the last entry %d", c, last))
	}
	if m.hasSnap {
		if m.snapIndex > last {
			return corrupt(walDir, fmt.Errorf("log ends at %d, before the snapshot at %d", last, m.snapIndex))
		}
		if t, _ := s.mem.term(m.snapIndex); t != m.snapTerm {
			return corrupt(walDir, fmt.Errorf("entry %d has term %d, the snapshot at this index has term %d", m.snapIndex, t, m.snapTerm))
		}
	}
	// Replace META with itself: a store that cannot replace it (a directory
	// it may not write, a read-only or full file system) could not take or
	// receive a snapshot, so it is refused now rather than stopping the
	// replica at its first snapshot.
	if err := s.writeMeta(m); err != nil {
		return fmt.Errorf("walstore: %s: rewriting %s: %w", s.dir, metaName, err)
	}
	return nil
}

// create makes a new store in a directory without META: a WAL, then META.
// A crash in between leaves a WAL without META, which holds nothing that
// was acknowledged (Open had not returned), so it is removed and created
// again; anything else in the directory is refused.
func (s *Store) create() error {
	des, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("walstore: read %s: %w", s.dir, err)
	}
	for _, de := range des {
		name := de.Name()
		path := filepath.Join(s.dir, name)
		switch {
		case name == lockName:
		case strings.HasSuffix(name, tmpSuffix):
			if err := os.RemoveAll(path); err != nil {
				return fmt.Errorf("walstore: remove %s: %w", path, err)
			}
		case strings.HasPrefix(name, "wal-") && de.IsDir() && emptyWAL(path):
			if err := os.RemoveAll(path); err != nil {
				return fmt.Errorf("walstore: remove %s: %w", path, err)
			}
		default:
			return corrupt(filepath.Join(s.dir, metaName), fmt.Errorf("missing, but the directory holds %s", name))
		}
	}
	m := meta{walGen: 1}
	w, err := wal.Create(s.lg.Named("wal"), filepath.Join(s.dir, walDirName(m.walGen)), nil)
	if err != nil {
		return fmt.Errorf("walstore: %s: create WAL: %w", s.dir, err)
	}
	s.w = w
	if err := s.writeMeta(m); err != nil {
		return fmt.Errorf("walstore: %s: %w", s.dir, err)
	}
	s.meta = m
	s.snapMeta = raftpb.EnsureSnapshotMetadata(nil)
	return nil
}

// emptyWAL reports whether the WAL in dir holds no entry and no hard state.
func emptyWAL(dir string) (empty bool) {
	defer func() {
		if recover() != nil {
			empty = false
		}
	}()
	w, err := wal.OpenForRead(zap.NewNop(), dir, nil)
	if err != nil {
		return false
	}
	defer func() { _ = w.Close() }()
	_, hs, ents, err := w.ReadAll()
	return (err == nil || errors.Is(err, wal.ErrSnapshotNotFound)) && len(ents) == 0 && raft.IsEmptyHardState(hs)
}

// removeLeftovers removes what a write that crashed before its commit point
// left behind: temporary files, snapshot files and WAL directories that META
// does not name. Failures are logged: leftovers do no harm.
func (s *Store) removeLeftovers() {
	des, err := os.ReadDir(s.dir)
	if err != nil {
		s.lg.Warn("walstore: list directory", zap.String("dir", s.dir), zap.Error(err))
		return
	}
	keepSnap := ""
	if s.meta.hasSnap {
		keepSnap = snapFileName(s.meta.snapTerm, s.meta.snapIndex)
	}
	keepWAL := walDirName(s.meta.walGen)
	for _, de := range des {
		name := de.Name()
		stale := strings.HasSuffix(name, tmpSuffix) ||
			(strings.HasSuffix(name, ".snap") && name != keepSnap) ||
			(strings.HasPrefix(name, "wal-") && de.IsDir() && name != keepWAL)
		if !stale {
			continue
		}
		s.lg.Info("walstore: removing the leftover of an interrupted write", zap.String("path", filepath.Join(s.dir, name)))
		if err := os.RemoveAll(filepath.Join(s.dir, name)); err != nil {
			s.lg.Warn("walstore: remove leftover", zap.String("path", name), zap.Error(err))
		}
	}
}

// probeName is the file probeWritable creates and removes. etcd's WAL
// ignores files ending in .tmp, so one left by a crash does no harm (the
// next probe truncates and removes it).
const probeName = "probe" + tmpSuffix

// probeWritable creates and removes a file in dir, failing if either
// cannot be done.
func probeWritable(dir string) error {
	p := filepath.Join(dir, probeName)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	return errors.Join(f.Close(), os.Remove(p))
}

// corrupt wraps err with storage.ErrCorrupt, naming the file.
func corrupt(path string, err error) error {
	return fmt.Errorf("walstore: %s: %w: %w", path, storage.ErrCorrupt, err)
}

// InitialState implements raft.Storage. It returns the saved hard state (an
// empty one before the first Save with a non-empty hard state) and the
// ConfState of the latest snapshot (empty, never nil, before the first
// SaveSnapshot).
func (s *Store) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, nil, ErrClosed
	}
	hs := new(raftpb.HardState)
	if s.hardState != nil {
		hs = proto.Clone(s.hardState).(*raftpb.HardState)
	}
	cs := raftpb.EnsureConfState(proto.Clone(s.snapMeta.GetConfState()).(*raftpb.ConfState))
	return hs, cs, nil
}

// Entries implements raft.Storage: the entries with indexes in [lo, hi), cut
// after the first entry whose cumulative marshalled size exceeds maxSize
// (bytes), but at least one entry. The slice is newly allocated and the
// caller may append to it; the entries are shared and must not be modified.
//
// It returns raft.ErrCompacted when lo <= FirstIndex()-1, raft.ErrUnavailable
// when the log is empty, and an error wrapping raft.ErrUnavailable when
// lo > hi or hi > LastIndex()+1.
func (s *Store) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	last := s.mem.lastIndex()
	switch {
	case lo <= s.mem.prevIndex:
		return nil, raft.ErrCompacted
	case lo > hi:
		return nil, fmt.Errorf("walstore: Entries(%d, %d): lo > hi: %w", lo, hi, raft.ErrUnavailable)
	case hi > last+1:
		return nil, fmt.Errorf("walstore: Entries(%d, %d): last index is %d: %w", lo, hi, last, raft.ErrUnavailable)
	case last == s.mem.prevIndex:
		return nil, raft.ErrUnavailable
	case lo == hi:
		return nil, nil
	}
	return s.mem.slice(lo, hi, maxSize), nil
}

// Term implements raft.Storage: the term of entry i, for i in
// [FirstIndex()-1, LastIndex()]. Term(FirstIndex()-1) is the term of the last
// discarded entry (0 for a store that never discarded any). It returns
// raft.ErrCompacted below that range and raft.ErrUnavailable above it.
func (s *Store) Term(i uint64) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, ErrClosed
	}
	return s.mem.term(i)
}

// LastIndex implements raft.Storage: the index of the last entry, or
// FirstIndex()-1 when the log is empty (0 for a new store).
func (s *Store) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, ErrClosed
	}
	return s.mem.lastIndex(), nil
}

// FirstIndex implements raft.Storage: the index of the first retained entry,
// one past the last index discarded by Compact or by a snapshot that replaced
// the log (1 for a new store). It may lie at or below the latest snapshot's
// index.
func (s *Store) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, ErrClosed
	}
	return s.mem.firstIndex(), nil
}

// Snapshot implements raft.Storage: the latest snapshot, read from its file
// and checked, or an empty snapshot (index 0, non-nil metadata) before the
// first SaveSnapshot. A snapshot file damaged since Open returns an error
// wrapping storage.ErrCorrupt.
func (s *Store) Snapshot() (*raftpb.Snapshot, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	if !s.meta.hasSnap {
		return &raftpb.Snapshot{Metadata: raftpb.EnsureSnapshotMetadata(nil)}, nil
	}
	return readSnap(filepath.Join(s.dir, snapFileName(s.meta.snapTerm, s.meta.snapIndex)), s.meta.snapIndex, s.meta.snapTerm)
}

// Identity implements storage.LogStore.
func (s *Store) Identity() (storage.Identity, bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return storage.Identity{}, false, ErrClosed
	}
	return s.meta.identity, s.meta.hasIdentity, nil
}

// Close records a deferred commit-only hard state in the WAL (skipped after
// a write failure), closes the WAL (which syncs its last segment) and
// releases the directory lock. After a write failure closing the WAL may
// fail too; the lock is released anyway. Calls after the first return
// ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	var err error
	if s.hsPending && s.writable() == nil {
		// A deferred commit-only hard state: recorded now (Close syncs the
		// WAL's tail), so that a clean restart starts from the commit index
		// reached.
		if err = s.w.Save(s.hardState, nil); err == nil {
			s.hsPending = false
		}
	}
	s.closed = true
	s.mem.reset(0, 0)
	if cerr := s.w.Close(); err == nil {
		err = cerr
	}
	if lerr := s.lock.Close(); err == nil {
		err = lerr
	}
	if err != nil {
		return fmt.Errorf("walstore: close %s: %w", s.dir, err)
	}
	return nil
}
