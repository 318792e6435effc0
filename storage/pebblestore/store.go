// Package pebblestore is the default storage.LogStore of a quorumlock replica:
// the raft log, hard state, latest snapshot and identity in one Pebble
// database, each Save one batch committed with a single fsync.
//
// Reads that raft makes on the hot path (Term and Entries of the log tail,
// FirstIndex, LastIndex) are answered from memory: the store keeps the log
// bounds, the snapshot metadata and a cache of the most recent entries (at
// most 4096 entries and 16 MiB of marshalled entries). Older entries and the
// snapshot data are read from Pebble.
//
// A failed commit or fsync is sticky: the failing call returns the error and
// every later write (Save, SaveSnapshot, Compact, SetIdentity) returns it too,
// because an fsync failure may have dropped written pages and retrying could
// acknowledge data that is not on disk. Reads keep working so the replica
// can stop cleanly: the log bounds, hard state and cached tail stay those of
// the last successful write, but an older entry read from Pebble may already
// show the failed write (Pebble applies a batch to its memtable before the
// fsync result is known).
package pebblestore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	crerrors "github.com/cockroachdb/errors"
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/storage"
)

// ErrClosed is returned by every method of a Store after Close.
var ErrClosed = errors.New("pebblestore: store is closed")

// Options configure Open. The zero value is ready to use.
type Options struct {
	// FS is the file system the store lives on. Tests pass vfs.NewMem() or an
	// error-injecting wrapper. The default (nil) is vfs.Default, the operating
	// system's file system; only then, on Linux amd64/arm64, do WAL syncs
	// wait off the Go processor while goroutines wait for one (Linux AIO;
	// docs/storage.md, "How a WAL sync waits").
	FS vfs.FS

	// Logger receives Pebble's messages and the store's own errors. The
	// default (nil) discards them.
	Logger *zap.Logger

	retryPause func() // tests: replaces fenceFS's pause before a refused Create
}

// Store is a storage.LogStore on a Pebble database. Create one with Open.
//
// All methods are safe for concurrent use; writes are serialized and a read
// never observes a partly applied Save. Close must be the last call.
type Store struct {
	dir  string
	log  *zap.Logger
	db   *pebble.DB
	lock *pebble.Lock // Pebble's directory lock, released after the database closes

	// syncs decides when WAL syncs wait off the processor (syncwait.go);
	// nil unless the store is on the operating system's file system.
	syncs *walSyncs

	// fatalMu guards fatal, the first failure Pebble reported through
	// Logger.Fatalf, possibly from one of its background goroutines.
	fatalMu sync.Mutex
	fatal   error

	// broken is the first failure of any kind (fatal or failed), readable
	// without a lock: WAL writes are dropped and no WAL is created once it
	// is set (walFile, walSizingFS), and fenceFS pauses Pebble's retries.
	broken atomic.Pointer[error]
	// fenced is the first failure after which Pebble's own state cannot be
	// trusted (a Logger.Fatalf, a failed directory sync): fenceFS refuses
	// every change to a file other than a WAL once it is set.
	fenced atomic.Pointer[error]

	// bgFailed is closed at Pebble's first BackgroundError (bgOnce). When it
	// comes while pebble.Open runs, Open gives up on it and sets abandoned:
	// fenceFS then parks Pebble's goroutines at their next change to a file.
	bgFailed  chan struct{}
	bgOnce    sync.Once
	abandoned atomic.Bool

	// opening is set until Open has loaded the store. Damage Pebble finds
	// meanwhile (a compaction reading a damaged table) is recorded in
	// openCorrupt, and Open fails with it once pebble.Open has returned,
	// instead of fencing the files or giving up on pebble.Open: either made
	// pebble.Open fail while its compaction still ran, and that compaction
	// then crashed the process in Pebble's released file cache (or Pebble
	// released the directory lock Open had already released).
	// openMu keeps a report that saw opening set from landing after Open
	// has read openCorrupt (it would be neither returned nor fenced).
	openMu      sync.Mutex
	opening     bool
	openCorrupt error

	mu        sync.RWMutex
	closed    bool
	failed    error                    // sticky write failure; nil while healthy
	hardState *raftpb.HardState        // nil until a non-empty one is saved
	hsPending bool                     // hardState (a commit-only change) is not written yet
	snapMeta  *raftpb.SnapshotMetadata // latest snapshot's metadata, never nil
	trunc     truncState               // entry before FirstIndex
	lastIndex uint64                   // trunc.index when the log is empty
	cache     *tailCache
	buf       []byte // marshalling scratch space; guarded by mu held for writing
	sizes     []int  // scratch space for Save; guarded by mu held for writing
}

var _ storage.LogStore = (*Store)(nil)

// Open opens the store in dir, creating dir and an empty store when missing,
// loads the log bounds, hard state, snapshot metadata and the log tail into
// memory, and reads every other record once to check it.
//
// Pebble replays its own WAL on open: a torn final record of the newest WAL
// file (a write that never completed) is dropped, as Pebble does; a damaged
// record that Pebble can tell was followed by synced data is corruption.
//
// Open fails when dir is locked by another open Store (Pebble's LOCK file),
// when the store was written in an unknown format, and, wrapping
// storage.ErrCorrupt with the directory and the key or Pebble's file, when a
// stored record fails its checksum or does not decode, a file the store
// needs is missing (a table, the MANIFEST, the format-version marker), or
// the records disagree (for example a hard state committing past the last
// entry).
// The caller owns the returned Store and must Close it.
func Open(dir string, opts Options) (*Store, error) {
	return open(dir, opts, defaultCacheLimits)
}

func open(dir string, opts Options, lim cacheLimits) (*Store, error) {
	if dir == "" {
		return nil, errors.New("pebblestore: empty directory name")
	}
	fs := opts.FS
	if fs == nil {
		fs = vfs.Default
	}
	logger := opts.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("pebblestore: create %s: %w", dir, err)
	}
	// Hold Pebble's directory lock while checking the WAL, so that no other
	// Store writes it meanwhile.
	lock, err := pebble.LockDirectory(dir, fs)
	if err != nil {
		return nil, fmt.Errorf("pebblestore: lock %s (is another store using it?): %w", dir, err)
	}
	if err := checkWALTail(fs, dir); err != nil {
		_ = lock.Close()
		return nil, err
	}
	if err := checkManifestTail(fs, dir); err != nil {
		_ = lock.Close()
		return nil, err
	}
	s := &Store{dir: dir, log: logger, lock: lock, bgFailed: make(chan struct{})}
	s.opening = true // before Pebble can report anything
	if opts.FS == nil {
		// Only on the operating system's file system: a WAL sync off the
		// processor goes to the descriptor directly, past any wrapper.
		s.syncs = newWALSyncs(logger)
	}
	popts := &pebble.Options{
		Lock: lock,
		FS: walSizingFS{
			FS:         fenceFS{FS: fs, fenced: s.fencedErr, broken: s.brokenErr, onSyncErr: s.setFenced, park: s.parkIfAbandoned, pause: opts.retryPause},
			syncs:      s.syncs,
			onWALError: s.setFatal,
			failed:     s.brokenErr,
		},
		Logger:             pebbleLogger{log: logger.Named("pebble").Sugar(), onFatal: s.setFenced},
		EventListener:      &pebble.EventListener{BackgroundError: s.backgroundError, DataCorruption: s.dataCorruption},
		FormatMajorVersion: pebble.FormatNewest,
		// A raft log is written at the tail and deleted at the head, and the
		// tail is served from the entry cache: modest memtables and block cache
		// suffice.
		MemTableSize: 8 << 20,
		// Pebble stalls a commit that needs a new memtable while the queued
		// ones add up to MemTableStopWritesThreshold memtables (default 2),
		// until a flush succeeds; a flush that fails (a full disk) meanwhile
		// leaves that Save blocked, where the store cannot fail it (a
		// snapshot larger than half a memtable queued behind a flush was
		// enough). The store fails at the first failed flush instead
		// (backgroundError), so the stall only needs to bound memory if
		// flushes fall far behind: 16 memtables, 128 MiB.
		MemTableStopWritesThreshold: 16,
		CacheSize:                   8 << 20,
		MaxOpenFiles:                256,
	}
	db, err := s.openPebble(dir, popts)
	if errors.Is(err, errAbandoned) {
		// Pebble's goroutines live on, parked before any change to a file,
		// so the directory can be opened again: the lock is released, both
		// this store's reference and the one the parked Open took (its
		// first step; a background error comes later).
		_ = s.syncs.close()
		_ = lock.Close()
		_ = lock.Close()
		return nil, fmt.Errorf("pebblestore: open %s: %w", dir, err)
	}
	if err != nil {
		_ = s.syncs.close()
		_ = lock.Close()
		// opening stays set: what pebble.Open left running must not
		// fence or crash anything now.
		if c := s.openDamage(); c != nil {
			return nil, fmt.Errorf("pebblestore: open %s: %w", dir, c)
		}
		if errors.Is(err, storage.ErrCorrupt) {
			return nil, fmt.Errorf("pebblestore: open %s: %w", dir, err)
		}
		if pebble.IsCorruptionError(err) {
			// Pebble names the damaged file (for example the WAL being
			// replayed) in the error's details, not in its message.
			if d := crerrors.FlattenDetails(err); d != "" {
				return nil, fmt.Errorf("pebblestore: open %s: %w: %w (%s)", dir, storage.ErrCorrupt, err, d)
			}
			return nil, fmt.Errorf("pebblestore: open %s: %w: %w", dir, storage.ErrCorrupt, err)
		}
		if what := missingPiece(err); what != "" {
			return nil, fmt.Errorf("pebblestore: open %s: %w: %s: %w", dir, storage.ErrCorrupt, what, err)
		}
		return nil, fmt.Errorf("pebblestore: open %s: %w", dir, err)
	}
	s.db = db
	if err := s.fatalErr(); err != nil {
		// Pebble could not open its new WAL (walSizingFS.deadWAL).
		_ = db.Close()
		_ = s.syncs.close()
		_ = lock.Close()
		return nil, fmt.Errorf("pebblestore: open %s: %w", dir, err)
	}
	if err := s.load(lim); err != nil {
		_ = db.Close()
		_ = s.syncs.close()
		_ = lock.Close()
		return nil, err
	}
	if c := s.endOpening(); c != nil {
		_ = db.Close()
		_ = s.syncs.close()
		_ = lock.Close()
		return nil, fmt.Errorf("pebblestore: open %s: %w", dir, c)
	}
	return s, nil
}

// load reads the persistent state into memory and writes the format version
// into a new store.
func (s *Store) load(lim cacheLimits) error {
	v, ok, err := s.get(keyVersion)
	if err != nil {
		return err
	}
	if !ok {
		if err := s.initVersion(); err != nil {
			return err
		}
	} else {
		ver, err := decodeUint64(v)
		if err != nil {
			return corrupt(s.dir, keyVersion, err)
		}
		if ver != formatVersion {
			return fmt.Errorf("pebblestore: %s: format version %d, this build reads only %d", s.dir, ver, formatVersion)
		}
	}

	if v, ok, err := s.get(keyHardState); err != nil {
		return err
	} else if ok {
		hs := new(raftpb.HardState)
		if err := proto.Unmarshal(v, hs); err != nil {
			return corrupt(s.dir, keyHardState, err)
		}
		s.hardState = hs
	}

	s.snapMeta = raftpb.EnsureSnapshotMetadata(nil)
	if v, ok, err := s.get(keySnapMeta); err != nil {
		return err
	} else if ok {
		m := new(raftpb.SnapshotMetadata)
		if err := proto.Unmarshal(v, m); err != nil {
			return corrupt(s.dir, keySnapMeta, err)
		}
		s.snapMeta = raftpb.EnsureSnapshotMetadata(m)
	}

	if v, ok, err := s.get(keyTrunc); err != nil {
		return err
	} else if ok {
		i, t, err := decodePair(v)
		if err != nil {
			return corrupt(s.dir, keyTrunc, err)
		}
		s.trunc = truncState{index: i, term: t}
	}
	if s.trunc.index > s.snapMeta.GetIndex() {
		return corrupt(s.dir, keyTrunc, fmt.Errorf("log discarded through %d, past the snapshot at %d", s.trunc.index, s.snapMeta.GetIndex()))
	}

	first, last, ok, err := s.entryBounds()
	if err != nil {
		return err
	}
	s.lastIndex = s.trunc.index
	if ok {
		if first != s.trunc.index+1 {
			return corrupt(s.dir, entryKey(first), fmt.Errorf("first stored entry, want %d", s.trunc.index+1))
		}
		s.lastIndex = last
	}
	if c := s.hardState.GetCommit(); c > s.lastIndex {
		return corrupt(s.dir, keyHardState, fmt.Errorf("commit index %d beyond last index %d", c, s.lastIndex))
	}
	if si := s.snapMeta.GetIndex(); si > s.lastIndex {
		return corrupt(s.dir, keySnapMeta, fmt.Errorf("snapshot index %d beyond last index %d", si, s.lastIndex))
	}
	if err := s.loadLog(lim); err != nil {
		return err
	}
	if si := s.snapMeta.GetIndex(); si > s.trunc.index {
		// The log keeps entries behind the snapshot: the entry at its index
		// must be the one the snapshot was taken at.
		if t, err := s.term(si); err != nil {
			return err
		} else if t != s.snapMeta.GetTerm() {
			return corrupt(s.dir, entryKey(si), fmt.Errorf("term %d, the snapshot at this index has term %d", t, s.snapMeta.GetTerm()))
		}
	}
	// Read the snapshot data and the identity once, so that damage to them
	// stops the replica now rather than when raft first sends the snapshot.
	if _, closer, err := s.db.Get(keySnapData); err == nil {
		if err := closer.Close(); err != nil {
			return s.readErr(keySnapData, err)
		}
	} else if !errors.Is(err, pebble.ErrNotFound) {
		return s.readErr(keySnapData, err)
	}
	_, _, err = s.identity()
	return err
}

func (s *Store) initVersion() error {
	// A store without a version must be new: anything else in it was written
	// by someone else.
	it, err := s.db.NewIter(nil)
	if err != nil {
		return fmt.Errorf("pebblestore: %s: %w", s.dir, err)
	}
	nonEmpty := it.First()
	var k []byte
	if nonEmpty {
		k = bytes.Clone(it.Key())
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return s.readErr(keyVersion, err)
	}
	if nonEmpty {
		return corrupt(s.dir, keyVersion, fmt.Errorf("missing, but the store holds %s", keyName(k)))
	}
	err = s.write(func(b *pebble.Batch) error {
		return b.Set(keyVersion, encodeUint64(formatVersion), nil)
	})
	if err != nil {
		return fmt.Errorf("pebblestore: %s: write format version: %w", s.dir, err)
	}
	return nil
}

// entryBounds returns the indexes of the first and last stored entries; ok is
// false when no entry is stored.
func (s *Store) entryBounds() (first, last uint64, ok bool, err error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: entryKeysStart, UpperBound: entryKeysEnd})
	if err != nil {
		return 0, 0, false, fmt.Errorf("pebblestore: %s: %w", s.dir, err)
	}
	defer func() {
		if cerr := it.Close(); cerr != nil && err == nil {
			err = s.readErr(entryKeysStart, cerr)
		}
	}()
	if !it.First() {
		return 0, 0, false, s.iterErr(it, entryKeysStart)
	}
	var fok, lok bool
	first, fok = parseEntryKey(it.Key())
	if !fok {
		return 0, 0, false, corrupt(s.dir, it.Key(), errors.New("malformed entry key"))
	}
	if !it.Last() {
		return 0, 0, false, s.iterErr(it, entryKeysStart)
	}
	last, lok = parseEntryKey(it.Key())
	if !lok || last < first {
		return 0, 0, false, corrupt(s.dir, it.Key(), errors.New("malformed entry key"))
	}
	return first, last, true, nil
}

// loadLog reads every retained entry, so that a missing or undecodable one
// fails Open, and keeps the newest within lim in the tail cache. The retained
// log is short (the snapshot interval plus the catch-up tail), so this is
// cheap next to restoring the state machine.
func (s *Store) loadLog(lim cacheLimits) error {
	s.cache = newTailCache(lim, s.trunc.index+1)
	if s.lastIndex == s.trunc.index {
		return nil
	}
	_, err := s.scanEntries(s.trunc.index+1, s.lastIndex+1, func(e *raftpb.Entry, size int) bool {
		s.cache.append(e, size)
		return true
	})
	return err
}

// scanEntries calls fn for each stored entry in [lo, hi), lo < hi, in index
// order until fn returns false (stopped is then true). It reports missing and
// undecodable entries as corruption.
func (s *Store) scanEntries(lo, hi uint64, fn func(e *raftpb.Entry, size int) bool) (stopped bool, err error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: entryKey(lo), UpperBound: entryKeyUpper(hi - 1)})
	if err != nil {
		return false, fmt.Errorf("pebblestore: %s: %w", s.dir, err)
	}
	defer func() {
		if cerr := it.Close(); cerr != nil && err == nil {
			err = s.readErr(entryKey(lo), cerr)
		}
	}()
	want := lo
	for ok := it.First(); ok; ok = it.Next() {
		idx, kok := parseEntryKey(it.Key())
		if !kok || idx != want {
			return false, corrupt(s.dir, entryKey(want), fmt.Errorf("missing, next stored key is %s", keyName(it.Key())))
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return false, s.readErr(entryKey(idx), err)
		}
		e, err := decodeEntry(idx, v)
		if err != nil {
			return false, corrupt(s.dir, entryKey(idx), err)
		}
		if !fn(e, len(v)) {
			return true, nil
		}
		want++
	}
	if err := it.Error(); err != nil {
		return false, s.readErr(entryKey(want), err)
	}
	if want != hi {
		return false, corrupt(s.dir, entryKey(want), errors.New("missing"))
	}
	return false, nil
}

func (s *Store) iterErr(it *pebble.Iterator, key []byte) error {
	if err := it.Error(); err != nil {
		return s.readErr(key, err)
	}
	return nil
}

// get returns a copy of the value stored under key; ok is false when there is
// none.
func (s *Store) get(key []byte) (v []byte, ok bool, err error) {
	val, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, s.readErr(key, err)
	}
	v = bytes.Clone(val)
	if err := closer.Close(); err != nil {
		return nil, false, s.readErr(key, err)
	}
	if v == nil {
		v = []byte{}
	}
	return v, true, nil
}

// readErr wraps a Pebble read failure of key; Pebble's corruption errors are
// also marked storage.ErrCorrupt.
func (s *Store) readErr(key []byte, err error) error {
	if pebble.IsCorruptionError(err) {
		return corrupt(s.dir, key, err)
	}
	return fmt.Errorf("pebblestore: %s: read %s: %w", s.dir, keyName(key), err)
}

// InitialState implements raft.Storage. It returns the saved hard state (an
// empty one before the first Save with a non-empty hard state) and the
// ConfState of the latest snapshot (empty, never nil, before the first
// snapshot). Both are copies the caller may keep.
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
// when the log is empty, an error wrapping raft.ErrUnavailable when lo > hi
// or hi > LastIndex()+1, and an error wrapping storage.ErrCorrupt when a
// stored entry is missing or fails to decode.
func (s *Store) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	if lo <= s.trunc.index {
		return nil, raft.ErrCompacted
	}
	if lo > hi {
		return nil, fmt.Errorf("pebblestore: Entries(%d, %d): lo > hi: %w", lo, hi, raft.ErrUnavailable)
	}
	if hi > s.lastIndex+1 {
		return nil, fmt.Errorf("pebblestore: Entries(%d, %d): last index is %d: %w", lo, hi, s.lastIndex, raft.ErrUnavailable)
	}
	if s.lastIndex == s.trunc.index {
		return nil, raft.ErrUnavailable
	}
	if lo == hi {
		return nil, nil
	}

	out := make([]*raftpb.Entry, 0, min(hi-lo, 256))
	var total uint64
	add := func(e *raftpb.Entry, size int) bool {
		if len(out) > 0 && total+uint64(size) > maxSize {
			return false
		}
		total += uint64(size)
		out = append(out, e)
		return true
	}
	if lo < s.cache.first {
		stopped, err := s.scanEntries(lo, min(hi, s.cache.first), add)
		if err != nil {
			return nil, err
		}
		if stopped {
			return out, nil
		}
	}
	for i := max(lo, s.cache.first); i < hi; i++ {
		if !add(s.cache.get(i), s.cache.size(i)) {
			break
		}
	}
	return out, nil
}

// Term implements raft.Storage: the term of entry i, for i in
// [FirstIndex()-1, LastIndex()]. Term(FirstIndex()-1) is the term of the last
// discarded entry, recorded by Compact or by a snapshot that replaced the log
// (0 for a store that never discarded any). It returns
// raft.ErrCompacted below that range, raft.ErrUnavailable above it, and an
// error wrapping storage.ErrCorrupt for an undecodable entry.
func (s *Store) Term(i uint64) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, ErrClosed
	}
	return s.term(i)
}

// term is Term with s.mu held.
func (s *Store) term(i uint64) (uint64, error) {
	switch {
	case i < s.trunc.index:
		return 0, raft.ErrCompacted
	case i == s.trunc.index:
		return s.trunc.term, nil
	case i > s.lastIndex:
		return 0, raft.ErrUnavailable
	}
	if e := s.cache.get(i); e != nil {
		return e.GetTerm(), nil
	}
	k := entryKey(i)
	v, ok, err := s.get(k)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, corrupt(s.dir, k, errors.New("missing"))
	}
	e, err := decodeEntry(i, v)
	if err != nil {
		return 0, corrupt(s.dir, k, err)
	}
	return e.GetTerm(), nil
}

// LastIndex implements raft.Storage: the index of the last entry, or
// FirstIndex()-1 when the log is empty (0 for a new store).
func (s *Store) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, ErrClosed
	}
	return s.lastIndex, nil
}

// FirstIndex implements raft.Storage: the index of the first retained entry,
// one past the last index discarded by Compact or by a snapshot that replaced
// the log (1 for a new store). It may lie at or below the latest snapshot's
// index: the log keeps a tail behind a snapshot until Compact.
func (s *Store) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, ErrClosed
	}
	return s.trunc.index + 1, nil
}

// Snapshot implements raft.Storage: a copy of the latest snapshot, read from
// Pebble, or an empty snapshot (index 0, non-nil metadata) before the first
// SaveSnapshot.
func (s *Store) Snapshot() (*raftpb.Snapshot, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	data, _, err := s.get(keySnapData)
	if err != nil {
		return nil, err
	}
	if len(data) == 0 {
		data = nil
	}
	return &raftpb.Snapshot{
		Metadata: proto.Clone(s.snapMeta).(*raftpb.SnapshotMetadata),
		Data:     data,
	}, nil
}

// Identity implements storage.LogStore.
func (s *Store) Identity() (storage.Identity, bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return storage.Identity{}, false, ErrClosed
	}
	return s.identity()
}

func (s *Store) identity() (storage.Identity, bool, error) {
	v, ok, err := s.get(keyIdentity)
	if err != nil || !ok {
		return storage.Identity{}, false, err
	}
	id, err := decodeIdentity(v)
	if err != nil {
		return storage.Identity{}, false, corrupt(s.dir, keyIdentity, err)
	}
	return id, true, nil
}

// Close writes a deferred commit-only hard state (one synced batch; skipped
// after a write failure), then closes the Pebble database. Calls after the
// first return ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	var err error
	if s.hsPending && s.writable() == nil {
		// A deferred commit-only hard state: written now, so that a clean
		// restart starts from the commit index reached.
		err = s.write(func(b *pebble.Batch) error {
			v, err := proto.Marshal(s.hardState)
			if err != nil {
				return err
			}
			return b.Set(keyHardState, v, nil)
		})
		if err == nil {
			s.hsPending = false
		}
	}
	s.closed = true
	s.cache = nil
	if cerr := s.db.Close(); err == nil {
		err = cerr
	}
	if serr := s.syncs.close(); err == nil {
		err = serr
	}
	if lerr := s.lock.Close(); err == nil {
		err = lerr
	}
	if err != nil {
		return fmt.Errorf("pebblestore: close %s: %w", s.dir, err)
	}
	return nil
}

// errAbandoned marks the error of an Open that gave up on pebble.Open.
// missingPiece describes what is missing when err, from pebble.Open, says
// that a file of an existing store is gone, and returns "" otherwise. Pebble
// reports a table or MANIFEST that its metadata names but the directory
// lacks as a "file does not exist" error, and a store holding data without
// its format-version marker as ErrDBNotPristine; neither is a corruption
// error to Pebble, yet neither can be left by a crash (Pebble writes and
// syncs a file before naming it), so both are damage to the store.
func missingPiece(err error) string {
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "a file the store names is missing"
	case errors.Is(err, pebble.ErrDBNotPristine):
		return "the store holds data but its format-version marker is missing"
	}
	return ""
}

var errAbandoned = errors.New("gave up opening the database")

// openPebble runs pebble.Open, giving up on it at the first background
// error. Pebble's Open flushes the log it replayed and waits for the flush
// to succeed; it retries a failed flush at once and forever, so on a full
// disk Open neither returns nor stops burning a processor (and a replica
// restarted there would hang in Start). Giving up returns the background
// error wrapped with errAbandoned and parks Pebble's goroutines at their
// next change to a file (fenceFS), where they stay with the memory of the
// replayed log until the process exits.
func (s *Store) openPebble(dir string, popts *pebble.Options) (*pebble.DB, error) {
	type opened struct {
		db  *pebble.DB
		err error
	}
	openc := make(chan opened, 1)
	go func() {
		db, err := pebble.Open(dir, popts)
		openc <- opened{db, err}
	}()
	select {
	case o := <-openc:
		return o.db, o.err
	case <-s.bgFailed:
	}
	select {
	case o := <-openc:
		return o.db, o.err
	default:
	}
	s.abandoned.Store(true)
	return nil, fmt.Errorf("%w: %w", errAbandoned, s.fatalErr())
}

// parkIfAbandoned blocks the calling goroutine for good once Open has given
// up on pebble.Open (openPebble).
func (s *Store) parkIfAbandoned() {
	if s.abandoned.Load() {
		select {}
	}
}

// backgroundError is Pebble's EventListener.BackgroundError: a flush or
// compaction failed (cancelled compactions are not reported), or a
// background read found damage. Pebble only logs such an error and tries
// again, at once and forever; a flush that keeps failing (a full disk) lets
// the memtables fill until Pebble stalls every commit, and the Save waiting
// in that stall never returns. So the first one is recorded as the sticky
// write error: the next write fails with it (the data already written is
// durable in Pebble's WAL) and the replica stops.
//
// Pebble reports every retry again; only the first is logged (fenceFS slows
// the retries down).
func (s *Store) backgroundError(err error) {
	if pebble.IsCorruptionError(err) {
		err = fmt.Errorf("%w: %w", storage.ErrCorrupt, err)
	}
	err = fmt.Errorf("pebblestore: %s: background flush or compaction: %w", s.dir, err)
	if errors.Is(err, storage.ErrCorrupt) && s.recordOpenCorrupt(err) {
		return // see Store.opening
	}
	s.setFatal(err)
	s.bgOnce.Do(func() {
		s.log.Error("pebblestore: pebble background error; the store refuses further writes", zap.Error(err))
		close(s.bgFailed)
	})
}

// dataCorruption is Pebble's EventListener.DataCorruption: a read (Open's
// flush or a compaction, or a read of the store's own) found a block of a
// table that fails its checksum. Pebble's default hands the event to
// Logger.Fatalf as text, which recorded a failure that neither wrapped
// storage.ErrCorrupt nor kept Pebble's error; a compaction that reached the
// damaged table during Open made Open fail with it. The error now wraps
// storage.ErrCorrupt and names the table; during Open it is recorded for
// Open to fail with (Store.opening), later the store is fenced as after any
// Fatalf.
func (s *Store) dataCorruption(info pebble.DataCorruptionInfo) {
	details := info.Details
	if details == nil {
		details = errors.New("on-disk corruption")
	}
	err := fmt.Errorf("pebblestore: %s: %w: %w", info.Path, storage.ErrCorrupt, details)
	s.log.Error("pebblestore: damaged table; the store refuses further writes", zap.Error(err))
	if s.recordOpenCorrupt(err) {
		return
	}
	s.setFenced(err)
}

// recordOpenCorrupt records err for Open to fail with and reports true
// while Open runs (Store.opening); afterwards it records nothing and
// reports false.
func (s *Store) recordOpenCorrupt(err error) bool {
	s.openMu.Lock()
	defer s.openMu.Unlock()
	if !s.opening {
		return false
	}
	if s.openCorrupt == nil {
		s.openCorrupt = err
	}
	return true
}

// openDamage returns the damage recorded while Open runs, if any.
func (s *Store) openDamage() error {
	s.openMu.Lock()
	defer s.openMu.Unlock()
	return s.openCorrupt
}

// endOpening ends Open's window (Store.opening) and returns the damage
// recorded in it, if any: from then on damage fences the store.
func (s *Store) endOpening() error {
	s.openMu.Lock()
	defer s.openMu.Unlock()
	s.opening = false
	return s.openCorrupt
}

// setFatal records the first failure Pebble reports through Logger.Fatalf
// or EventListener.BackgroundError.
func (s *Store) setFatal(err error) {
	s.fatalMu.Lock()
	defer s.fatalMu.Unlock()
	if s.fatal == nil {
		s.fatal = err
	}
	s.markBroken(err)
}

// markBroken records err as the store's first failure of any kind, unless
// one is recorded already.
func (s *Store) markBroken(err error) {
	s.broken.CompareAndSwap(nil, &err)
}

// brokenErr returns the store's first failure of any kind, or nil.
func (s *Store) brokenErr() error {
	if p := s.broken.Load(); p != nil {
		return *p
	}
	return nil
}

// setFenced records a failure after which Pebble's own state cannot be
// trusted (Logger.Fatalf, a failed directory sync): like setFatal, and it
// raises the fence (fenceFS) first.
func (s *Store) setFenced(err error) {
	s.fenced.CompareAndSwap(nil, &err)
	s.setFatal(err)
}

// fencedErr returns the failure that fences the files, or nil.
func (s *Store) fencedErr() error {
	if p := s.fenced.Load(); p != nil {
		return *p
	}
	return nil
}

func (s *Store) fatalErr() error {
	s.fatalMu.Lock()
	defer s.fatalMu.Unlock()
	return s.fatal
}
