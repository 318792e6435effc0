package storagetest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/quorumlock/quorumlock/storage"
)

// testMatchesMemoryStorage applies random sequences of the writes raft makes
// to the store and to a raft.MemoryStorage and compares every read after
// each step. Writes follow raft's rules where the store is allowed to rely on
// them: the commit index never decreases, committed entries are never cut
// off, entries at or below the snapshot are only ever re-sent unchanged, and
// a snapshot from a leader lies past the commit index. Compact of the store
// is compared with MemoryStorage.Compact, which the store allows only up to
// its snapshot.
func testMatchesMemoryStorage(t *testing.T, h *harness) {
	// The harness store is not used: every check gets a fresh directory.
	base := h.dir
	checks := 0
	rapid.Check(t, func(rt *rapid.T) {
		checks++
		dir := filepath.Join(base, fmt.Sprintf("check-%d", checks))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			rt.Fatal(err)
		}
		m := &model{t: t, open: h.open, dir: dir, ms: raft.NewMemoryStorage()}
		m.s = h.open(t, dir)
		defer func() {
			if m.s != nil {
				_ = m.s.Close()
			}
			_ = os.RemoveAll(dir)
		}()
		rt.Repeat(map[string]func(*rapid.T){
			"":               m.check,
			"save":           m.save,
			"snapshotLocal":  m.snapshotLocal,
			"snapshotLeader": m.snapshotLeader,
			"snapshotStale":  m.snapshotStale,
			"compact":        m.compact,
			"reopen":         m.reopen,
			"entries":        m.entries,
			"term":           m.term,
		})
	})
}

type model struct {
	t    *testing.T // for open, which takes a *testing.T
	open func(t *testing.T, dir string) storage.LogStore
	dir  string

	s     storage.LogStore
	ms    *raft.MemoryStorage
	hs    *raftpb.HardState // last saved non-empty hard state, nil before
	snaps uint64            // leader snapshots so far, to give each a fresh term
}

func (m *model) bounds() (first, last uint64) {
	first, _ = m.ms.FirstIndex()
	last, _ = m.ms.LastIndex()
	return first, last
}

// snapIndex is the index of MemoryStorage's latest snapshot.
func (m *model) snapIndex() uint64 {
	snap, _ := m.ms.Snapshot()
	return snap.GetMetadata().GetIndex()
}

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

func (m *model) save(rt *rapid.T) {
	first, last := m.bounds()
	commit := m.hs.GetCommit()
	start := rapid.Uint64Range(max(1, sub(first, 2)), last+1).Draw(rt, "start")
	snapIndex := m.snapIndex()
	minN := uint64(1)
	if start <= commit {
		minN = commit - start + 1 // never cut off committed entries
	}
	if start <= snapIndex {
		// Entries up to the snapshot are re-sent unchanged, and at least one
		// follows them: MemoryStorage would otherwise cut its log short of
		// its own snapshot, which the store (rightly) does not do.
		minN = max(minN, snapIndex-start+2)
	}
	n := rapid.Uint64Range(minN, minN+4).Draw(rt, "n")
	term := rapid.Uint64Range(1, 9).Draw(rt, "term")
	var ents []*raftpb.Entry
	for i := start; i < start+n; i++ {
		if i >= first && i <= snapIndex {
			old, err := m.ms.Entries(i, i+1, noLimit)
			if err != nil {
				rt.Fatalf("MemoryStorage.Entries(%d, %d): %v", i, i+1, err)
			}
			ents = append(ents, old[0])
			continue
		}
		pad := rapid.IntRange(0, 64).Draw(rt, "pad")
		e := entry(i, term)
		e.Data = append(e.Data, make([]byte, pad)...)
		ents = append(ents, e)
	}
	newLast := last
	if start+n-1 >= first {
		newLast = start + n - 1
	}
	var hs *raftpb.HardState
	if rapid.Bool().Draw(rt, "withHardState") {
		hs = hardState(
			rapid.Uint64Range(m.hs.GetTerm(), m.hs.GetTerm()+2).Draw(rt, "hsTerm"),
			rapid.Uint64Range(0, 3).Draw(rt, "hsVote"),
			rapid.Uint64Range(commit, newLast).Draw(rt, "hsCommit"),
		)
	}

	if err := m.s.Save(hs, cloneEntries(ents)); err != nil {
		rt.Fatalf("Save(%v, %s): %v", hs, describe(ents), err)
	}
	if err := m.ms.Append(cloneEntries(ents)); err != nil {
		rt.Fatalf("MemoryStorage.Append: %v", err)
	}
	if !raft.IsEmptyHardState(hs) {
		m.hs = hs
	}
}

func (m *model) snapshotLocal(rt *rapid.T) {
	first, last := m.bounds()
	lo := max(first, m.snapIndex()+1)
	if last < lo {
		rt.Skip("no entry past the snapshot")
	}
	index := rapid.Uint64Range(lo, last).Draw(rt, "index")
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, rapid.Uint64Range(3, 5).Draw(rt, "voter")}}
	snap, err := m.ms.CreateSnapshot(index, cs, fmt.Appendf(nil, "local state at %d", index))
	if err != nil {
		rt.Fatalf("MemoryStorage.CreateSnapshot(%d): %v", index, err)
	}
	if err := m.s.SaveSnapshot(proto.Clone(snap).(*raftpb.Snapshot)); err != nil {
		rt.Fatalf("SaveSnapshot(index %d, term %d): %v", index, snap.GetMetadata().GetTerm(), err)
	}
}

func (m *model) snapshotLeader(rt *rapid.T) {
	first, last := m.bounds()
	index := rapid.Uint64Range(max(first, m.snapIndex()+1, m.hs.GetCommit()+1), last+5).Draw(rt, "index")
	m.snaps++
	// No entry ever has this term, so the snapshot never matches the log.
	snap := snapshot(index, 1000+m.snaps, []uint64{1, 2, 3}, fmt.Sprintf("leader state at %d", index))
	if err := m.ms.ApplySnapshot(proto.Clone(snap).(*raftpb.Snapshot)); err != nil {
		rt.Fatalf("MemoryStorage.ApplySnapshot(%d): %v", index, err)
	}
	if err := m.s.SaveSnapshot(snap); err != nil {
		rt.Fatalf("SaveSnapshot(index %d): %v", index, err)
	}
	// The snapshot replaced the log, so it raised the commit index to it.
	if m.hs.GetCommit() < index {
		hs := hardState(m.hs.GetTerm(), m.hs.GetVote(), index)
		m.hs = hs
	}
}

func (m *model) snapshotStale(rt *rapid.T) {
	snapIndex := m.snapIndex()
	if snapIndex == 0 {
		rt.Skip("no snapshot yet")
	}
	index := rapid.Uint64Range(0, snapIndex).Draw(rt, "index")
	snap := snapshot(index, 1, []uint64{7}, "stale")
	if err := m.ms.ApplySnapshot(proto.Clone(snap).(*raftpb.Snapshot)); err != raft.ErrSnapOutOfDate {
		rt.Fatalf("MemoryStorage.ApplySnapshot(index %d): err = %v, want raft.ErrSnapOutOfDate", index, err)
	}
	if err := m.s.SaveSnapshot(snap); !errors.Is(err, raft.ErrSnapOutOfDate) {
		rt.Fatalf("SaveSnapshot(index %d) at or below the snapshot at %d: err = %v, want raft.ErrSnapOutOfDate", index, snapIndex, err)
	}
}

func (m *model) compact(rt *rapid.T) {
	first, last := m.bounds()
	snapIndex := m.snapIndex()
	index := rapid.Uint64Range(0, last+2).Draw(rt, "index")
	err := m.s.Compact(index)
	switch {
	case index < first:
		if !errors.Is(err, raft.ErrCompacted) {
			rt.Fatalf("Compact(%d) with FirstIndex %d: err = %v, want raft.ErrCompacted", index, first, err)
		}
	case index > snapIndex:
		if !errors.Is(err, storage.ErrCompactBeyondSnapshot) {
			rt.Fatalf("Compact(%d) past the snapshot at %d: err = %v, want storage.ErrCompactBeyondSnapshot", index, snapIndex, err)
		}
	default:
		if err != nil {
			rt.Fatalf("Compact(%d) with FirstIndex %d and the snapshot at %d: %v", index, first, snapIndex, err)
		}
		if err := m.ms.Compact(index); err != nil {
			rt.Fatalf("MemoryStorage.Compact(%d): %v", index, err)
		}
	}
}

func (m *model) reopen(rt *rapid.T) {
	if err := m.s.Close(); err != nil {
		rt.Fatalf("Close: %v", err)
	}
	m.s = nil
	m.s = m.open(m.t, m.dir)
}

func (m *model) entries(rt *rapid.T) {
	first, last := m.bounds()
	lo := rapid.Uint64Range(sub(first, 2), last+1).Draw(rt, "lo")
	hi := rapid.Uint64Range(lo, last+1).Draw(rt, "hi")
	maxSize := rapid.OneOf(rapid.Uint64Range(0, 400), rapid.Just(uint64(noLimit))).Draw(rt, "maxSize")
	m.compareEntries(rt, lo, hi, maxSize)
}

func (m *model) compareEntries(rt *rapid.T, lo, hi, maxSize uint64) {
	want, wantErr := m.ms.Entries(lo, hi, maxSize)
	got, err := m.s.Entries(lo, hi, maxSize)
	what := fmt.Sprintf("Entries(%d, %d, %d)", lo, hi, maxSize)
	if wantErr != nil {
		if err != wantErr {
			rt.Fatalf("%s: err = %v, want exactly %v as MemoryStorage", what, err, wantErr)
		}
		return
	}
	if err != nil {
		rt.Fatalf("%s: %v", what, err)
	}
	if len(got) != len(want) {
		rt.Fatalf("%s returned %s, MemoryStorage %s", what, describe(got), describe(want))
	}
	for k := range want {
		if !proto.Equal(got[k], want[k]) {
			rt.Fatalf("%s: entry %d = %v, MemoryStorage %v", what, k, got[k], want[k])
		}
	}
}

func (m *model) term(rt *rapid.T) {
	first, last := m.bounds()
	i := rapid.Uint64Range(sub(first, 3), last+3).Draw(rt, "i")
	m.compareTerm(rt, i)
}

func (m *model) compareTerm(rt *rapid.T, i uint64) {
	want, wantErr := m.ms.Term(i)
	got, err := m.s.Term(i)
	if err != wantErr || got != want {
		rt.Fatalf("Term(%d) = %d, %v; MemoryStorage %d, %v", i, got, err, want, wantErr)
	}
}

// check compares the bounds, every term, the whole log, the initial state
// and the snapshot.
func (m *model) check(rt *rapid.T) {
	first, last := m.bounds()
	if got, err := m.s.FirstIndex(); err != nil || got != first {
		rt.Fatalf("FirstIndex() = %d, %v; MemoryStorage %d", got, err, first)
	}
	if got, err := m.s.LastIndex(); err != nil || got != last {
		rt.Fatalf("LastIndex() = %d, %v; MemoryStorage %d", got, err, last)
	}
	for i := sub(first, 2); i <= last+1; i++ {
		m.compareTerm(rt, i)
	}
	m.compareEntries(rt, first, last+1, noLimit)

	hs, cs, err := m.s.InitialState()
	if err != nil {
		rt.Fatalf("InitialState: %v", err)
	}
	if hs.GetTerm() != m.hs.GetTerm() || hs.GetVote() != m.hs.GetVote() || hs.GetCommit() != m.hs.GetCommit() {
		rt.Fatalf("InitialState hard state = %v, want %v", hs, m.hs)
	}
	_, wantCS, _ := m.ms.InitialState()
	if cs == nil {
		rt.Fatal("InitialState returned a nil ConfState")
	}
	if err := raftpb.EnsureConfState(proto.Clone(cs).(*raftpb.ConfState)).Equivalent(wantCS); err != nil {
		rt.Fatalf("InitialState ConfState = %v, MemoryStorage %v: %v", cs, wantCS, err)
	}
	snap, err := m.s.Snapshot()
	if err != nil {
		rt.Fatalf("Snapshot: %v", err)
	}
	want, _ := m.ms.Snapshot()
	if snap.GetMetadata().GetIndex() != want.GetMetadata().GetIndex() ||
		snap.GetMetadata().GetTerm() != want.GetMetadata().GetTerm() ||
		string(snap.GetData()) != string(want.GetData()) {
		rt.Fatalf("Snapshot() = %v, MemoryStorage %v", snap, want)
	}
}

func cloneEntries(ents []*raftpb.Entry) []*raftpb.Entry {
	out := make([]*raftpb.Entry, len(ents))
	for k, e := range ents {
		out[k] = proto.Clone(e).(*raftpb.Entry)
	}
	return out
}
