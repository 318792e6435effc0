package crashtest

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/internal/service"
	"github.com/quorumlock/quorumlock/storage/pebblestore"
)

// recStore records how many entries the latest Save carried, so that a
// failpoint can tell a Ready that wrote entries from one that did not.
type recStore struct {
	*pebblestore.Store
	lastSave atomic.Int64
}

func (s *recStore) Save(st *raftpb.HardState, ents []*raftpb.Entry) error {
	s.lastSave.Store(int64(len(ents)))
	return s.Store.Save(st, ents)
}

// describe reports the store's durable raft state, for failure messages.
func describe(s raft.Storage) string {
	hs, _, err := s.InitialState()
	if err != nil {
		return err.Error()
	}
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	snap, _ := s.Snapshot()
	md := snap.GetMetadata()
	return fmt.Sprintf("hard state term %d vote %d commit %d; log [%d, %d]; snapshot at index %d term %d",
		hs.GetTerm(), hs.GetVote(), hs.GetCommit(), first, last, md.GetIndex(), md.GetTerm())
}

// applyLog remembers, for every index any replica ever applied, a digest of
// the entry applied there, and reports a replica (in any life) that applies
// another entry at the same index. It also counts, per replica, the entries
// a later life applied again at an index an earlier life had applied.
type applyLog struct {
	mu        sync.Mutex
	at        map[uint64]appliedEntry
	lifeOf    map[uint64]map[uint64]int // replica -> index -> first life that applied it
	reapplied map[uint64]int
	errs      []string
}

func newApplyLog() *applyLog {
	return &applyLog{
		at:        make(map[uint64]appliedEntry),
		lifeOf:    make(map[uint64]map[uint64]int),
		reapplied: make(map[uint64]int),
	}
}

type appliedEntry struct {
	sum        [sha256.Size]byte
	term       uint64
	rep        uint64
	life       int
	hasPayload bool
}

func entrySum(e *raftpb.Entry) [sha256.Size]byte {
	h := sha256.New()
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], e.GetTerm())
	binary.BigEndian.PutUint64(b[8:], uint64(e.GetType()))
	h.Write(b[:])
	h.Write(e.GetData())
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

func (l *applyLog) record(rep uint64, life int, e *raftpb.Entry) {
	sum := entrySum(e)
	l.mu.Lock()
	defer l.mu.Unlock()
	idx := e.GetIndex()
	lives := l.lifeOf[rep]
	if lives == nil {
		lives = make(map[uint64]int)
		l.lifeOf[rep] = lives
	}
	if first, ok := lives[idx]; !ok {
		lives[idx] = life
	} else if first < life {
		l.reapplied[rep]++
	}
	if prev, ok := l.at[idx]; ok {
		if prev.sum != sum {
			l.errs = append(l.errs, fmt.Sprintf(
				"replica %d (life %d) applied index %d (term %d), where replica %d (life %d) had applied another entry (term %d)",
				rep, life, idx, e.GetTerm(), prev.rep, prev.life, prev.term))
		}
		return
	}
	l.at[idx] = appliedEntry{sum: sum, term: e.GetTerm(), rep: rep, life: life, hasPayload: len(e.GetData()) > 0}
}

// max returns the highest index applied anywhere.
func (l *applyLog) max() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var m uint64
	for idx := range l.at {
		m = max(m, idx)
	}
	return m
}

// reappliedBy returns how many entries replica rep applied in a later life
// at indexes an earlier life had applied.
func (l *applyLog) reappliedBy(rep uint64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reapplied[rep]
}

func (l *applyLog) errors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.errs)
}

// recSM is the service as the node's state machine, recording what it
// applies: into the cluster's applyLog, and its own applied index, which
// must move one entry at a time or jump forward to a restored snapshot.
type recSM struct {
	*service.Service
	rep  uint64
	life int
	log  *applyLog

	freeze atomic.Pointer[freeze] // set while (and after) the replica is a crash victim

	mu        sync.Mutex
	applied   uint64
	payloads  int    // entries with a payload applied
	readyTerm uint64 // term of the latest LeaderReady
	errs      []string
}

// freeze holds a victim's applies from the crash instant until the crash
// is decided: dead drops them (the replica is down since that instant).
type freeze struct {
	done chan struct{}
	dead bool // set before done is closed
}

func (s *recSM) Apply(ents []*raftpb.Entry) {
	if f := s.freeze.Load(); f != nil {
		<-f.done
		if f.dead {
			return
		}
	}
	s.mu.Lock()
	for _, e := range ents {
		if e.GetIndex() != s.applied+1 {
			s.errs = append(s.errs, fmt.Sprintf("replica %d (life %d) applied index %d after %d",
				s.rep, s.life, e.GetIndex(), s.applied))
		}
		s.applied = e.GetIndex()
		if len(e.GetData()) > 0 {
			s.payloads++
		}
		s.log.record(s.rep, s.life, e)
	}
	s.mu.Unlock()
	s.Service.Apply(ents)
}

func (s *recSM) Restore(index uint64, data []byte) error {
	if err := s.Service.Restore(index, data); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if index < s.applied {
		s.errs = append(s.errs, fmt.Sprintf("replica %d (life %d) restored a snapshot at %d after applying %d",
			s.rep, s.life, index, s.applied))
	}
	s.applied = index
	return nil
}

func (s *recSM) LeaderReady(term uint64) {
	s.Service.LeaderReady(term)
	s.mu.Lock()
	s.readyTerm = term
	s.mu.Unlock()
}

func (s *recSM) payloadsApplied() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.payloads
}

func (s *recSM) ready() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readyTerm
}

func (s *recSM) errors() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.errs)
}
