// Package storage declares LogStore, the durable raft log that a quorumlock
// replica runs on, and the errors its backends return.
//
// A LogStore is raft.Storage (what the raft state machine reads) plus the
// writes the Ready loop makes: Save persists the HardState and new entries of
// one Ready in a single synced write, before any message that depends on them
// is sent (go.etcd.io/raft doc.go, Ready contract step 1). Snapshots and log
// compaction are part of the interface so that backends are complete; the
// replica takes snapshots once the durability work lands.
//
// Backends live in sub-packages: storage/pebblestore (the default).
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
type LogStore interface {
	raft.Storage

	// Save durably persists st (skipped when nil or empty) and ents in one
	// synced write. ents are consecutive; an entry whose index is at or below
	// the last index replaces the existing entry with that index and drops every
	// entry after it (raft's log-matching overwrite). An error from the
	// underlying sync is returned as is: the caller must stop the replica and
	// must not retry (an fsync failure may have lost the written pages).
	Save(st *raftpb.HardState, ents []*raftpb.Entry) error

	// SaveSnapshot durably records snap as the latest snapshot, discards the
	// log entries it covers, and makes FirstIndex snap.Index+1. A snapshot
	// older than the current one returns raft.ErrSnapOutOfDate.
	SaveSnapshot(snap *raftpb.Snapshot) error

	// Compact discards entries up to and including index, which must be at or
	// below the index of the latest durable snapshot (ErrCompactBeyondSnapshot
	// otherwise). Compacting an already compacted index returns
	// raft.ErrCompacted.
	Compact(index uint64) error

	// Identity returns the identity recorded in the store; ok is false for a
	// store that has none yet.
	Identity() (id Identity, ok bool, err error)

	// SetIdentity records id durably. It returns ErrIdentityMismatch if a
	// different identity is already recorded.
	SetIdentity(id Identity) error

	// Close releases the store. It does not sync: every Save already did.
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
	// data fails its checks.
	ErrCorrupt = errors.New("storage: corrupt data")

	// ErrNonContiguous is returned by Save for entries that leave a gap after
	// the last index or are not consecutive.
	ErrNonContiguous = errors.New("storage: entries are not contiguous with the log")
)
