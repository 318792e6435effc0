package raftnode

import (
	"encoding/binary"
	"fmt"
	"io"

	"go.etcd.io/raft/v3/raftpb"
)

// SaveSnapshot keeps the log behind a snapshot that matches it (the node's
// own snapshots), and replaces it otherwise (a leader's), as storage.LogStore
// requires.
func (s *memStore) SaveSnapshot(snap *raftpb.Snapshot) error {
	md := snap.GetMetadata()
	if last, _ := s.LastIndex(); md.GetIndex() <= last {
		if t, err := s.Term(md.GetIndex()); err == nil && t == md.GetTerm() {
			_, err := s.CreateSnapshot(md.GetIndex(), md.GetConfState(), snap.GetData())
			return err
		}
	}
	return s.ApplySnapshot(snap)
}

// Compact discards the log up to compactIndex, after checking that a
// snapshot saved before covers it (invariant 10: a snapshot is durable
// before the log it replaces is truncated); a Compact past the saved
// snapshot is recorded for the cluster's close to report.
func (s *memStore) Compact(compactIndex uint64) error {
	snap, err := s.MemoryStorage.Snapshot()
	if err != nil {
		return err
	}
	if si := snap.GetMetadata().GetIndex(); compactIndex > si {
		s.mu.Lock()
		s.compactErrs = append(s.compactErrs, fmt.Sprintf("compacted to %d with the saved snapshot at %d", compactIndex, si))
		s.mu.Unlock()
	}
	return s.MemoryStorage.Compact(compactIndex)
}

// takeCompactErrs returns and forgets the Compacts past the saved snapshot.
func (s *memStore) takeCompactErrs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.compactErrs
	s.compactErrs = nil
	return v
}

// Snapshot writes the index of the last applied entry as the image.
func (s *recSM) Snapshot() (uint64, func(io.Writer) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var index uint64
	if n := len(s.applied); n > 0 {
		index = s.applied[n-1].GetIndex()
	}
	return index, func(w io.Writer) error {
		_, err := w.Write(binary.AppendUvarint(nil, index))
		return err
	}
}

// Restore records a snapshot as applied up to index.
func (s *recSM) Restore(index uint64, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, smEvent{kind: "restore", last: index})
	s.applied = append(s.applied, &raftpb.Entry{Index: new(index), Term: new(uint64(0))})
	return nil
}
