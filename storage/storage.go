// Package storage declares LogStore, the durable raft log that a quorumlock
// replica runs on, and the errors its backends return.
//
// A LogStore is raft.Storage (what the raft state machine reads) plus the
// writes the Ready loop makes. For each Ready, in this order:
//
//  1. SaveSnapshot(rd.Snapshot) when the Ready carries a snapshot (one received
//     from the leader). It replaces the log, so it must come first: the
//     entries of the same Ready continue after the snapshot, and its hard
//     state may commit up to the snapshot's index.
//  2. Save(rd.HardState, rd.Entries): one synced write, before any message
//     that depends on them is sent (go.etcd.io/raft doc.go, Ready contract
//     step 1). A hard state that only moves the commit index, with no
//     entries, need not be durable (raft.MustSync is false): the backends
//     keep it in memory and write it with the next Save.
//
// Snapshots the replica takes of its own applied state are recorded with
// SaveSnapshot too; they keep the log. Compact then discards the log up to an
// index at or below the snapshot, so a replica can keep a tail of entries
// behind its snapshot (etcd keeps 5000) for followers that are only a little
// behind, instead of sending them the whole snapshot. FirstIndex is always the
// first retained entry, which may lie at or below the snapshot's index.
//
// Backends live in sub-packages: storage/pebblestore (the default) and
// storage/walstore (etcd's WAL plus snapshot files). storage/storagetest is
// the conformance suite both pass. docs/storage.md describes their on-disk
// layouts and recovery rules.
package storage

import (
	"errors"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Identity names the cluster and the member a data directory belongs to. It is
// written once, when the directory is first used, and checked on every start:
// a replica refuses to run on a directory of another cluster or member.
type Identity struct {
	ClusterID uint64
	MemberID  uint64
}

// LogStore is a durable raft log. Methods of raft.Storage may be called from
// the raft goroutine while Save runs on the same goroutine; implementations
// must be safe for that pattern, and Close must be the last call.
//
// Every write (Save, SaveSnapshot, Compact, SetIdentity) is durable when it
// returns nil, except a Save without entries whose hard state differs from
// the saved one only in Commit (raft.MustSync is false): that hard state is
// kept in memory (InitialState reports it) and written with the next Save,
// so after a crash (or Close) the commit index may read as an earlier saved
// value, which raft learns again from the leader. Every write that reaches the
// disk is synced. A write that fails in the underlying write or sync is returned
// wrapped (errors.Is finds the cause, for example a syscall.Errno) and is
// sticky: that call and every later write return it. The caller must stop the
// replica and must not retry: an fsync failure may have dropped written pages,
// so the outcome of the failed write is unknown (after a restart it may or
// may not be found). Reads keep answering so that the replica can stop
// cleanly.
type LogStore interface {
	raft.Storage

	// Save durably persists st (skipped when nil or empty) and ents in one
	// synced write (a commit-only st without ents is deferred to the next
	// Save, see LogStore). ents are non-nil (a nil entry is an error, and
	// nothing is written), consecutive and start at or below LastIndex()+1;
	// otherwise Save returns an error wrapping ErrNonContiguous and writes
	// nothing; st's commit index past the last index the Save leaves
	// returns an error wrapping ErrCommitBeyondLog and writes nothing. Entries at or below the latest snapshot's index are covered by
	// it and skipped (raft never rewrites them: a snapshot holds only
	// committed entries). An entry above it and at or below LastIndex()
	// replaces the stored entry with its index and drops every entry after it
	// (raft's log-matching overwrite). Write and sync failures are wrapped
	// and sticky, as described on LogStore.
	Save(st *raftpb.HardState, ents []*raftpb.Entry) error

	// SaveSnapshot durably records snap (metadata and data) as the latest
	// snapshot. When the log holds the entry at snap's index with snap's term
	// (a snapshot this replica took of its applied state), the log is kept
	// as it is: the entries at or below snap's index stay until Compact
	// discards them. Otherwise (a snapshot received from the leader) the log
	// cannot be trusted to match and is replaced: FirstIndex becomes
	// snap.Index+1 and LastIndex snap.Index, and in the same durable write
	// the hard state's commit index is raised to snap.Index if it was lower
	// (a snapshot holds only committed entries, and raft refuses to start
	// with a commit index below FirstIndex()-1, which a crash before the
	// following Save would otherwise leave). In a Ready that carries a
	// snapshot, call SaveSnapshot before Save.
	//
	// A snapshot at or below the current snapshot's index returns
	// raft.ErrSnapOutOfDate (a snapshot at index 0 is accepted while the
	// current one is at 0 too, to record a bootstrap ConfState).
	SaveSnapshot(snap *raftpb.Snapshot) error

	// Compact durably discards the entries up to and including index, which
	// must be at or below the latest snapshot's index (an error wrapping
	// ErrCompactBeyondSnapshot otherwise). FirstIndex becomes index+1 and
	// Term(index) keeps answering. Compacting at or below FirstIndex()-1
	// returns raft.ErrCompacted.
	Compact(index uint64) error

	// Identity returns the identity recorded in the store; ok is false for a
	// store that has none yet.
	Identity() (id Identity, ok bool, err error)

	// SetIdentity records id durably. It returns ErrIdentityMismatch if a
	// different identity is already recorded.
	SetIdentity(id Identity) error

	// Close writes a deferred commit-only hard state (synced), so that a
	// replica restarted after a clean stop starts from the commit index it
	// reached, then releases the store. A store whose writes failed skips
	// the write. After Close every method returns an error.
	Close() error
}

var (
	// ErrIdentityMismatch is returned by SetIdentity when the store already
	// belongs to another cluster or member.
	ErrIdentityMismatch = errors.New("storage: data directory belongs to another cluster or member")

	// ErrCompactBeyondSnapshot is returned by Compact for an index past the
	// latest durable snapshot.
	ErrCompactBeyondSnapshot = errors.New("storage: compaction index beyond the latest snapshot")

	// ErrCorrupt is returned (wrapped, with the file and position) when stored
	// data fails its checks. Backends return it from Open for anything but a
	// torn final record, which they repair.
	ErrCorrupt = errors.New("storage: corrupt data")

	// ErrNonContiguous is returned by Save for entries that leave a gap after
	// the last index or are not consecutive.
	ErrNonContiguous = errors.New("storage: entries are not contiguous with the log")

	// ErrCommitBeyondLog is returned by Save for a hard state whose commit
	// index is past the last index the Save leaves (raft never commits an
	// entry a log does not hold; a store holding one could not be opened).
	ErrCommitBeyondLog = errors.New("storage: commit index beyond the last log index")
)
