package service

import (
	"fmt"
	"io"

	"github.com/quorumlock/quorumlock/internal/fsm"
)

// Snapshot implements raftnode.StateMachine: it freezes the lock table on
// the raft goroutine (cost: the sessions, not the locks) and returns the
// writer of the image, which runs while apply goes on.
func (s *Service) Snapshot() (uint64, func(io.Writer) error) {
	s.mu.Lock()
	snap := s.m.Snapshot()
	s.mu.Unlock()
	return snap.Index(), func(w io.Writer) error {
		_, err := snap.WriteTo(w)
		return err
	}
}

// VerifySnapshot implements raftnode.SnapshotVerifier: it decodes the image
// of a snapshot received from the leader before raftnode makes it durable,
// and keeps the decoded table for the Restore that follows.
func (s *Service) VerifySnapshot(index uint64, data []byte) error {
	m, err := decodeSnapshot(index, data, s.cfg.Limits)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.verified = m
	s.mu.Unlock()
	return nil
}

func decodeSnapshot(index uint64, data []byte, l fsm.Limits) (*fsm.Machine, error) {
	m, err := fsm.Restore(data, l)
	if err != nil {
		return nil, err
	}
	if m.Applied() != index {
		return nil, fmt.Errorf("service: snapshot image is at index %d, its metadata says %d", m.Applied(), index)
	}
	return m, nil
}

// Restore implements raftnode.StateMachine: the lock table becomes the
// snapshot's. Watchers see the new state.
func (s *Service) Restore(index uint64, data []byte) error {
	s.mu.Lock()
	m := s.verified
	s.verified = nil
	s.mu.Unlock()
	if m == nil || m.Applied() != index {
		var err error
		if m, err = decodeSnapshot(index, data, s.cfg.Limits); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m = m
	// Sessions that ended inside the snapshot's span wake their waiters
	// (a leader never restores; this is for completeness).
	for sess := range s.grants {
		if _, ok := m.Session(sess); !ok {
			for name := range s.grants[sess] {
				s.deliverGrant(sess, name, outcome{notLeader: true}, true)
			}
		}
	}
	if len(s.watchers) > 0 {
		s.notifyWatchers()
	}
	return nil
}
