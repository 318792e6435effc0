// Package storagetest is the conformance suite every storage.LogStore backend
// must pass. A backend's tests call Run with a function that opens the
// backend in a directory:
//
//	func TestConformance(t *testing.T) {
//		storagetest.Run(t, func(t *testing.T, dir string) storage.LogStore {
//			s, err := mystore.Open(dir)
//			if err != nil {
//				t.Fatal(err)
//			}
//			return s
//		})
//	}
//
// The suite checks the raft.Storage contract with raft.MemoryStorage as the
// reference (including a randomized comparison with pgregory.net/rapid), the
// writes of storage.LogStore, the documented errors, bad input (an error,
// never a panic) and that everything survives Close and reopen.
//
// Where MemoryStorage panics the suite requires an error instead: Save of
// entries that leave a gap or are not consecutive returns
// storage.ErrNonContiguous, and Entries with lo > hi or hi > LastIndex()+1
// returns an error wrapping raft.ErrUnavailable. raft.ErrCompacted and
// raft.ErrUnavailable from Entries and Term on the ranges raft itself asks
// for must be returned unwrapped, because raft compares them with ==.
//
// SaveSnapshot and Compact semantics the suite pins down: a snapshot whose
// index and term match an entry in the log (taken locally) keeps the whole
// log, entries behind it included, until Compact discards them; any other
// snapshot (received from a leader) replaces the whole log, leaving
// FirstIndex = index+1 and LastIndex = index, and raises the hard state's
// commit index to index. Compact discards entries up to an index at or below
// the latest snapshot. Save skips entries at or below the latest snapshot's
// index. Reads run concurrently with writes (run the suite with -race).
//
// Crash behaviour that every backend must show is tested too: a writer in a
// child process (the test binary, run again) is killed with SIGKILL at random
// points, and everything a write returned for must be found after reopening.
package storagetest

import (
	"errors"
	"fmt"
	"math"
	"os"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/storage"
)

// Run runs the conformance suite as subtests of t. open must return a store
// in dir, creating it when dir is empty and reopening it otherwise, and fail
// t (t.Fatal) when it cannot. Every subtest uses its own t.TempDir(); the
// suite closes every store it opens. Subtests do not run in parallel.
//
// Unless SkipCrash is given, open must keep the store in dir on the real
// file system: the crash case reopens a directory a child process wrote.
func Run(t *testing.T, open func(t *testing.T, dir string) storage.LogStore, opts ...Option) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	cases := []struct {
		name string
		fn   func(t *testing.T, h *harness)
	}{
		{"Empty", testEmpty},
		{"SaveEntriesAndHardState", testSaveEntriesAndHardState},
		{"Bootstrap", testBootstrap},
		{"Overwrite", testOverwrite},
		{"NonContiguous", testNonContiguous},
		{"EntriesMaxSize", testEntriesMaxSize},
		{"EntriesCallerOwnsSlice", testEntriesCallerOwnsSlice},
		{"TermAndErrors", testTermAndErrors},
		{"SnapshotKeepsLog", testSnapshotKeepsLog},
		{"SnapshotReplacesLog", testSnapshotReplacesLog},
		{"SnapshotThenSave", testSnapshotThenSave},
		{"SnapshotOutOfDate", testSnapshotOutOfDate},
		{"SaveSkipsSnapshotEntries", testSaveSkipsSnapshotEntries},
		{"Compact", testCompact},
		{"CompactAll", testCompactAll},
		{"LargeSnapshot", testLargeSnapshot},
		{"Identity", testIdentity},
		{"BadInput", testBadInput},
		{"ManyEntries", testManyEntries},
		{"Reopen", testReopen},
		{"CloseWritesCommit", testCloseWritesCommit},
		{"ConcurrentReads", testConcurrentReads},
		{"MatchesMemoryStorage", testMatchesMemoryStorage},
		{"KillDuringWrites", testKillDuringWrites},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "KillDuringWrites" {
				if cfg.skipCrash {
					t.Skip("storagetest.SkipCrash")
				}
				if dir := os.Getenv(killDirEnv); dir != "" {
					// The writer child of testKillDuringWrites. It opens no
					// harness: it is killed, so a directory of its own
					// would never be removed.
					killChild(t, open, dir)
					return
				}
			}
			c.fn(t, newHarness(t, open))
		})
	}
}

// Option changes how Run runs the suite.
type Option func(*config)

type config struct {
	skipCrash bool
}

// SkipCrash tells Run to skip the crash case, in which a child process (the
// test binary, run again) writes a directory that open then reopens in this
// process. Use it when open keeps stores where another process cannot find
// them (an in-memory file system), or for variants of a backend (small
// caches, small segments) whose crash behaviour the main run already tests.
func SkipCrash() Option {
	return func(c *config) { c.skipCrash = true }
}

// noLimit is the maxSize that never cuts Entries short.
const noLimit = math.MaxUint64

// harness owns the store under test and its directory.
type harness struct {
	t    *testing.T
	open func(t *testing.T, dir string) storage.LogStore
	dir  string
	s    storage.LogStore // nil while closed
}

func newHarness(t *testing.T, open func(t *testing.T, dir string) storage.LogStore) *harness {
	h := &harness{t: t, open: open, dir: t.TempDir()}
	h.s = open(t, h.dir)
	if h.s == nil {
		t.Fatal("storagetest: open returned a nil store")
	}
	t.Cleanup(func() {
		if h.s != nil {
			_ = h.s.Close()
		}
	})
	return h
}

// reopen closes the store and opens the same directory again.
func (h *harness) reopen() {
	h.t.Helper()
	if err := h.s.Close(); err != nil {
		h.t.Fatalf("Close: %v", err)
	}
	h.s = nil
	h.s = h.open(h.t, h.dir)
	if h.s == nil {
		h.t.Fatal("storagetest: open returned a nil store")
	}
}

// save calls Save and fails the test on error.
func (h *harness) save(hs *raftpb.HardState, ents []*raftpb.Entry) {
	h.t.Helper()
	if err := h.s.Save(hs, ents); err != nil {
		h.t.Fatalf("Save(%v, %s): %v", hs, describe(ents), err)
	}
}

// compact calls Compact and fails the test on error.
func (h *harness) compact(index uint64) {
	h.t.Helper()
	if err := h.s.Compact(index); err != nil {
		h.t.Fatalf("Compact(%d): %v", index, err)
	}
}

// entry returns a normal entry whose data names its index and term.
func entry(index, term uint64) *raftpb.Entry {
	return &raftpb.Entry{
		Index: new(index),
		Term:  new(term),
		Type:  raftpb.EntryType_EntryNormal.Enum(),
		Data:  fmt.Appendf(nil, "entry %d term %d", index, term),
	}
}

// entries returns entries lo..hi (inclusive) with the given term.
func entries(lo, hi, term uint64) []*raftpb.Entry {
	var out []*raftpb.Entry
	for i := lo; i <= hi; i++ {
		out = append(out, entry(i, term))
	}
	return out
}

func hardState(term, vote, commit uint64) *raftpb.HardState {
	return &raftpb.HardState{Term: new(term), Vote: new(vote), Commit: new(commit)}
}

func describe(ents []*raftpb.Entry) string {
	if len(ents) == 0 {
		return "[]"
	}
	return fmt.Sprintf("[%d entries %d..%d]", len(ents), ents[0].GetIndex(), ents[len(ents)-1].GetIndex())
}

// logState is what a store's log must look like: entries first..first+len-1
// and the term of entry first-1.
type logState struct {
	first    uint64
	prevTerm uint64
	ents     []*raftpb.Entry
}

func (l logState) last() uint64 { return l.first + uint64(len(l.ents)) - 1 }

// checkLog verifies FirstIndex, LastIndex, Term over the whole range and one
// step past each end, and Entries of the whole log.
func checkLog(t *testing.T, s storage.LogStore, want logState) {
	t.Helper()
	first, err := s.FirstIndex()
	if err != nil || first != want.first {
		t.Fatalf("FirstIndex() = %d, %v; want %d", first, err, want.first)
	}
	last, err := s.LastIndex()
	if err != nil || last != want.last() {
		t.Fatalf("LastIndex() = %d, %v; want %d", last, err, want.last())
	}
	if term, err := s.Term(first - 1); err != nil || term != want.prevTerm {
		t.Fatalf("Term(FirstIndex()-1 = %d) = %d, %v; want %d", first-1, term, err, want.prevTerm)
	}
	if first >= 2 {
		if _, err := s.Term(first - 2); err != raft.ErrCompacted {
			t.Fatalf("Term(%d) below FirstIndex()-1: err = %v, want raft.ErrCompacted", first-2, err)
		}
	}
	if _, err := s.Term(last + 1); err != raft.ErrUnavailable {
		t.Fatalf("Term(LastIndex()+1 = %d): err = %v, want raft.ErrUnavailable", last+1, err)
	}
	for _, e := range want.ents {
		if term, err := s.Term(e.GetIndex()); err != nil || term != e.GetTerm() {
			t.Fatalf("Term(%d) = %d, %v; want %d", e.GetIndex(), term, err, e.GetTerm())
		}
	}
	if len(want.ents) == 0 {
		if _, err := s.Entries(first, last+1, noLimit); err != raft.ErrUnavailable {
			t.Fatalf("Entries(%d, %d) of an empty log: err = %v, want raft.ErrUnavailable", first, last+1, err)
		}
		return
	}
	got, err := s.Entries(first, last+1, noLimit)
	if err != nil {
		t.Fatalf("Entries(%d, %d): %v", first, last+1, err)
	}
	checkEntries(t, fmt.Sprintf("Entries(%d, %d)", first, last+1), got, want.ents)
}

func checkEntries(t *testing.T, what string, got, want []*raftpb.Entry) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s returned %s, want %s", what, describe(got), describe(want))
	}
	for k := range want {
		if !proto.Equal(got[k], want[k]) {
			t.Fatalf("%s: entry %d = %v, want %v", what, k, got[k], want[k])
		}
	}
}

func checkHardState(t *testing.T, s storage.LogStore, want *raftpb.HardState) {
	t.Helper()
	hs, cs, err := s.InitialState()
	if err != nil {
		t.Fatalf("InitialState: %v", err)
	}
	if cs == nil {
		t.Fatal("InitialState returned a nil ConfState")
	}
	if hs.GetTerm() != want.GetTerm() || hs.GetVote() != want.GetVote() || hs.GetCommit() != want.GetCommit() {
		t.Fatalf("InitialState hard state = %v, want %v", hs, want)
	}
}

func checkSnapshot(t *testing.T, s storage.LogStore, want *raftpb.Snapshot) {
	t.Helper()
	got, err := s.Snapshot()
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if got == nil || got.GetMetadata() == nil {
		t.Fatalf("Snapshot() = %v, want non-nil snapshot and metadata", got)
	}
	gm, wm := got.GetMetadata(), want.GetMetadata()
	if gm.GetIndex() != wm.GetIndex() || gm.GetTerm() != wm.GetTerm() || string(got.GetData()) != string(want.GetData()) {
		t.Fatalf("Snapshot() = index %d term %d data %q, want index %d term %d data %q",
			gm.GetIndex(), gm.GetTerm(), got.GetData(), wm.GetIndex(), wm.GetTerm(), want.GetData())
	}
	checkConfState(t, "Snapshot().Metadata.ConfState", gm.GetConfState(), wm.GetConfState())
	_, cs, err := s.InitialState()
	if err != nil {
		t.Fatalf("InitialState: %v", err)
	}
	checkConfState(t, "InitialState ConfState", cs, wm.GetConfState())
}

func checkConfState(t *testing.T, what string, got, want *raftpb.ConfState) {
	t.Helper()
	if got == nil {
		t.Fatalf("%s is nil", what)
	}
	w := want
	if w == nil {
		w = new(raftpb.ConfState)
	}
	if err := raftpb.EnsureConfState(proto.Clone(got).(*raftpb.ConfState)).Equivalent(
		raftpb.EnsureConfState(proto.Clone(w).(*raftpb.ConfState))); err != nil {
		t.Fatalf("%s = %v, want %v: %v", what, got, w, err)
	}
}

func snapshot(index, term uint64, voters []uint64, data string) *raftpb.Snapshot {
	return &raftpb.Snapshot{
		Metadata: &raftpb.SnapshotMetadata{
			Index:     new(index),
			Term:      new(term),
			ConfState: &raftpb.ConfState{Voters: voters},
		},
		Data: []byte(data),
	}
}

// wantIs fails the test unless errors.Is(err, target).
func wantIs(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

// wantExactly fails the test unless err == target: raft compares
// ErrCompacted and ErrUnavailable with ==.
func wantExactly(t *testing.T, what string, err, target error) {
	t.Helper()
	if err != target {
		t.Fatalf("%s: err = %v, want exactly %v (raft compares with ==)", what, err, target)
	}
}
