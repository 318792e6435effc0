package storagetest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/storage"
)

func testEmpty(t *testing.T, h *harness) {
	for round := range 2 {
		if round == 1 {
			h.reopen()
		}
		checkLog(t, h.s, logState{first: 1})
		wantExactly(t, "Entries(0, 1)", errOf(h.s.Entries(0, 1, noLimit)), raft.ErrCompacted)
		wantIs(t, "Entries(1, 2) past the end", errOf(h.s.Entries(1, 2, noLimit)), raft.ErrUnavailable)
		hs, cs, err := h.s.InitialState()
		if err != nil {
			t.Fatalf("InitialState: %v", err)
		}
		if !raft.IsEmptyHardState(hs) {
			t.Fatalf("InitialState hard state = %v, want empty", hs)
		}
		checkConfState(t, "InitialState ConfState", cs, nil)
		snap, err := h.s.Snapshot()
		if err != nil || snap == nil || snap.GetMetadata() == nil || !raft.IsEmptySnap(snap) {
			t.Fatalf("Snapshot() = %v, %v; want an empty snapshot with metadata", snap, err)
		}
		if _, ok, err := h.s.Identity(); ok || err != nil {
			t.Fatalf("Identity() ok = %v, err = %v; want false, nil", ok, err)
		}
	}
}

func testSaveEntriesAndHardState(t *testing.T, h *harness) {
	h.save(hardState(1, 2, 0), entries(1, 3, 1))
	want := logState{first: 1, ents: entries(1, 3, 1)}
	checkLog(t, h.s, want)
	checkHardState(t, h.s, hardState(1, 2, 0))

	// Entries alone keep the hard state; nil and empty hard states are skipped.
	h.save(nil, entries(4, 5, 2))
	h.save(&raftpb.HardState{}, entries(6, 6, 2))
	want.ents = append(want.ents, entries(4, 5, 2)...)
	want.ents = append(want.ents, entries(6, 6, 2)...)
	checkLog(t, h.s, want)
	checkHardState(t, h.s, hardState(1, 2, 0))

	// A hard state alone.
	h.save(hardState(2, 3, 5), nil)
	checkHardState(t, h.s, hardState(2, 3, 5))
	h.save(nil, nil)

	h.reopen()
	checkLog(t, h.s, want)
	checkHardState(t, h.s, hardState(2, 3, 5))
}

// testBootstrap follows raft's RawNode.Bootstrap: conf-change entries at
// 1..n, term 1, into an empty store, then a hard state committing them.
func testBootstrap(t *testing.T, h *harness) {
	var ents []*raftpb.Entry
	for i := uint64(1); i <= 3; i++ {
		cc := &raftpb.ConfChange{Type: raftpb.ConfChangeType_ConfChangeAddNode.Enum(), NodeId: new(i)}
		data, err := proto.Marshal(cc)
		if err != nil {
			t.Fatal(err)
		}
		ents = append(ents, &raftpb.Entry{
			Index: new(i), Term: new(uint64(1)),
			Type: raftpb.EntryType_EntryConfChange.Enum(), Data: data,
		})
	}
	h.save(nil, ents)
	h.save(hardState(1, 0, 3), nil)
	h.reopen()
	checkLog(t, h.s, logState{first: 1, ents: ents})
	checkHardState(t, h.s, hardState(1, 0, 3))
}

func testOverwrite(t *testing.T, h *harness) {
	h.save(nil, entries(1, 10, 1))

	// A shorter suffix from a new leader drops everything after it.
	h.save(nil, entries(5, 7, 2))
	want := logState{first: 1, ents: append(entries(1, 4, 1), entries(5, 7, 2)...)}
	checkLog(t, h.s, want)

	// A longer one extends the log.
	h.save(nil, entries(6, 12, 3))
	want.ents = append(entries(1, 4, 1), append(entries(5, 5, 2), entries(6, 12, 3)...)...)
	checkLog(t, h.s, want)

	// Replacing only the last entry.
	h.save(nil, entries(12, 12, 4))
	want.ents = append(want.ents[:11:11], entries(12, 12, 4)...)
	checkLog(t, h.s, want)

	h.reopen()
	checkLog(t, h.s, want)

	// Replacing the whole log.
	h.save(nil, entries(1, 2, 5))
	want.ents = entries(1, 2, 5)
	checkLog(t, h.s, want)
	h.reopen()
	checkLog(t, h.s, want)

	// Entries dropped by an overwrite do not come back when the log grows.
	h.save(nil, entries(3, 4, 6))
	want.ents = append(want.ents, entries(3, 4, 6)...)
	checkLog(t, h.s, want)
}

func testNonContiguous(t *testing.T, h *harness) {
	h.save(hardState(1, 1, 2), entries(1, 5, 1))
	want := logState{first: 1, ents: entries(1, 5, 1)}

	wantIs(t, "Save with a gap after the last index", h.s.Save(hardState(2, 2, 3), entries(7, 8, 2)), storage.ErrNonContiguous)
	gappy := []*raftpb.Entry{entry(6, 1), entry(7, 1), entry(9, 1)}
	wantIs(t, "Save of non-consecutive entries", h.s.Save(hardState(2, 2, 3), gappy), storage.ErrNonContiguous)
	backwards := []*raftpb.Entry{entry(6, 1), entry(5, 1)}
	wantIs(t, "Save of decreasing indexes", h.s.Save(nil, backwards), storage.ErrNonContiguous)

	// A rejected Save writes nothing, not even its hard state, and the store
	// keeps accepting valid writes.
	checkLog(t, h.s, want)
	checkHardState(t, h.s, hardState(1, 1, 2))
	h.save(nil, entries(6, 6, 1))
	want.ents = append(want.ents, entry(6, 1))
	checkLog(t, h.s, want)
	h.reopen()
	checkLog(t, h.s, want)
	checkHardState(t, h.s, hardState(1, 1, 2))
}

func testEntriesMaxSize(t *testing.T, h *harness) {
	ents := entries(1, 10, 1)
	h.save(nil, ents)
	size := func(es []*raftpb.Entry) uint64 {
		var n uint64
		for _, e := range es {
			n += uint64(proto.Size(e))
		}
		return n
	}
	for round := range 2 {
		if round == 1 {
			h.reopen()
		}
		cases := []struct {
			lo, hi, maxSize uint64
			want            []*raftpb.Entry
		}{
			{1, 11, noLimit, ents},
			{3, 7, noLimit, ents[2:6]},
			{10, 11, noLimit, ents[9:]},
			{4, 4, noLimit, nil},
			// At least one entry, even when it alone exceeds maxSize.
			{1, 11, 0, ents[:1]},
			{5, 11, 1, ents[4:5]},
			// Cut after the last entry that keeps the sum within maxSize.
			{1, 11, size(ents[:3]), ents[:3]},
			{1, 11, size(ents[:3]) + 1, ents[:3]},
			{1, 11, size(ents[:4]) - 1, ents[:3]},
			{2, 6, size(ents[1:5]), ents[1:5]},
			{2, 6, size(ents[1:3]), ents[1:3]},
		}
		for _, c := range cases {
			got, err := h.s.Entries(c.lo, c.hi, c.maxSize)
			if err != nil {
				t.Fatalf("Entries(%d, %d, %d): %v", c.lo, c.hi, c.maxSize, err)
			}
			checkEntries(t, "Entries", got, c.want)
		}
	}
}

func testEntriesCallerOwnsSlice(t *testing.T, h *harness) {
	h.save(nil, entries(1, 6, 1))
	for round := range 2 {
		if round == 1 {
			h.reopen()
		}
		got, err := h.s.Entries(2, 4, noLimit)
		if err != nil {
			t.Fatal(err)
		}
		// raft appends to the returned slice and may overwrite its elements.
		got = append(got, entry(100, 100), entry(101, 100))
		got[0] = entry(200, 200)
		_ = got
		all, err := h.s.Entries(1, 7, noLimit)
		if err != nil {
			t.Fatal(err)
		}
		checkEntries(t, "Entries after the caller appended to an earlier result", all, entries(1, 6, 1))
	}
}

func testTermAndErrors(t *testing.T, h *harness) {
	h.save(nil, append(entries(1, 3, 1), entries(4, 8, 2)...))
	if err := h.s.SaveSnapshot(snapshot(4, 2, []uint64{1}, "state at 4")); err != nil {
		t.Fatalf("SaveSnapshot: %v", err)
	}
	h.compact(4)
	for round := range 2 {
		if round == 1 {
			h.reopen()
		}
		if term, err := h.s.Term(4); err != nil || term != 2 {
			t.Fatalf("Term(FirstIndex()-1 = 4) = %d, %v; want 2, the term of the last compacted entry", term, err)
		}
		for _, i := range []uint64{0, 1, 3} {
			_, err := h.s.Term(i)
			wantExactly(t, "Term below FirstIndex()-1", err, raft.ErrCompacted)
		}
		for _, i := range []uint64{9, 100} {
			_, err := h.s.Term(i)
			wantExactly(t, "Term past LastIndex()", err, raft.ErrUnavailable)
		}
		for _, lo := range []uint64{0, 1, 4} {
			wantExactly(t, "Entries from a compacted index", errOf(h.s.Entries(lo, 9, noLimit)), raft.ErrCompacted)
		}
		wantIs(t, "Entries(5, 10) past LastIndex()+1", errOf(h.s.Entries(5, 10, noLimit)), raft.ErrUnavailable)
		checkLog(t, h.s, logState{first: 5, prevTerm: 2, ents: entries(5, 8, 2)})
	}
}

// testSnapshotKeepsLog saves local snapshots (their index and term match an
// entry): the log stays whole, entries behind the snapshot included, until
// Compact.
func testSnapshotKeepsLog(t *testing.T, h *harness) {

	h.save(hardState(3, 1, 8), append(entries(1, 5, 2), entries(6, 10, 3)...))
	all := append(entries(1, 5, 2), entries(6, 10, 3)...)
	snap := snapshot(7, 3, []uint64{1, 2, 3}, "state at 7")
	if err := h.s.SaveSnapshot(snap); err != nil {
		t.Fatalf("SaveSnapshot: %v", err)
	}
	want := logState{first: 1, ents: all}
	checkLog(t, h.s, want)
	checkSnapshot(t, h.s, snap)

	// The log grows and is overwritten after the snapshot as before.
	h.save(nil, entries(10, 12, 4))
	want.ents = append(all[:9:9], entries(10, 12, 4)...)
	checkLog(t, h.s, want)

	h.reopen()
	checkLog(t, h.s, want)
	checkSnapshot(t, h.s, snap)
	checkHardState(t, h.s, hardState(3, 1, 8))

	// Compact leaves a tail behind the snapshot.
	h.compact(5)
	want = logState{first: 6, prevTerm: 2, ents: want.ents[5:]}
	checkLog(t, h.s, want)
	h.reopen()
	checkLog(t, h.s, want)
	checkSnapshot(t, h.s, snap)

	// A later snapshot at the last index keeps the log too; compacting to it
	// empties the log but keeps its end.
	snap2 := snapshot(12, 4, []uint64{1, 2, 3, 4}, "state at 12")
	if err := h.s.SaveSnapshot(snap2); err != nil {
		t.Fatalf("SaveSnapshot: %v", err)
	}
	checkLog(t, h.s, want)
	checkSnapshot(t, h.s, snap2)
	h.compact(12)
	checkLog(t, h.s, logState{first: 13, prevTerm: 4})
	h.reopen()
	checkLog(t, h.s, logState{first: 13, prevTerm: 4})
	checkSnapshot(t, h.s, snap2)
	h.save(nil, entries(13, 14, 4))
	checkLog(t, h.s, logState{first: 13, prevTerm: 4, ents: entries(13, 14, 4)})
}

func testSnapshotReplacesLog(t *testing.T, h *harness) {
	h.save(hardState(1, 1, 3), entries(1, 10, 1))

	// A snapshot whose term does not match the entry at its index comes from
	// a leader whose log differs: the whole log goes.
	snap := snapshot(6, 2, []uint64{1, 2, 3}, "leader state at 6")
	if err := h.s.SaveSnapshot(snap); err != nil {
		t.Fatalf("SaveSnapshot: %v", err)
	}
	want := logState{first: 7, prevTerm: 2}
	checkLog(t, h.s, want)
	// The snapshot holds only committed entries: the commit index moves up
	// to it, so that raft accepts the store even if the Save of the same
	// Ready never happens.
	checkHardState(t, h.s, hardState(1, 1, 6))
	h.reopen()
	checkLog(t, h.s, want)
	checkSnapshot(t, h.s, snap)
	checkHardState(t, h.s, hardState(1, 1, 6))

	// Entries from the leader follow the snapshot.
	h.save(hardState(2, 0, 8), entries(7, 8, 2))
	want.ents = entries(7, 8, 2)
	checkLog(t, h.s, want)

	// A snapshot past the last index.
	snap = snapshot(20, 3, []uint64{1, 2, 3}, "leader state at 20")
	if err := h.s.SaveSnapshot(snap); err != nil {
		t.Fatalf("SaveSnapshot: %v", err)
	}
	want = logState{first: 21, prevTerm: 3}
	checkLog(t, h.s, want)
	checkHardState(t, h.s, hardState(2, 0, 20))
	wantIs(t, "Save leaving a gap after a snapshot", h.s.Save(nil, entries(22, 22, 3)), storage.ErrNonContiguous)
	h.save(nil, entries(21, 21, 3))
	want.ents = entries(21, 21, 3)
	h.reopen()
	checkLog(t, h.s, want)
	checkSnapshot(t, h.s, snap)
}

// testSnapshotThenSave follows a Ready that carries a leader's snapshot:
// SaveSnapshot first, then Save of the hard state committing the snapshot and
// of the entries after it.
func testSnapshotThenSave(t *testing.T, h *harness) {
	h.save(hardState(1, 1, 4), entries(1, 6, 1))
	snap := snapshot(9, 2, []uint64{1, 2, 3}, "leader state at 9")
	if err := h.s.SaveSnapshot(snap); err != nil {
		t.Fatalf("SaveSnapshot: %v", err)
	}
	// A crash here, before the Save of the same Ready, leaves a store raft
	// accepts: the commit index is not below FirstIndex()-1.
	h.reopen()
	checkLog(t, h.s, logState{first: 10, prevTerm: 2})
	checkHardState(t, h.s, hardState(1, 1, 9))
	h.save(hardState(2, 0, 11), entries(10, 11, 2))
	want := logState{first: 10, prevTerm: 2, ents: entries(10, 11, 2)}
	for round := range 2 {
		if round == 1 {
			h.reopen()
		}
		checkLog(t, h.s, want)
		checkHardState(t, h.s, hardState(2, 0, 11))
		checkSnapshot(t, h.s, snap)
	}
}

func testSnapshotOutOfDate(t *testing.T, h *harness) {
	h.save(nil, entries(1, 10, 1))
	snap := snapshot(5, 1, []uint64{1}, "state at 5")
	if err := h.s.SaveSnapshot(snap); err != nil {
		t.Fatalf("SaveSnapshot: %v", err)
	}
	for round := range 2 {
		if round == 1 {
			h.reopen()
		}
		for _, i := range []uint64{0, 3, 5} {
			err := h.s.SaveSnapshot(snapshot(i, 1, []uint64{9}, "old"))
			wantIs(t, "SaveSnapshot of an older snapshot", err, raft.ErrSnapOutOfDate)
		}
		checkLog(t, h.s, logState{first: 1, ents: entries(1, 10, 1)})
		checkSnapshot(t, h.s, snap)
	}
}

// testSaveSkipsSnapshotEntries saves entries at and below the snapshot's
// index that differ from the log (raft never does): they are skipped, and
// the entries after them are written as usual.
func testSaveSkipsSnapshotEntries(t *testing.T, h *harness) {
	h.save(nil, entries(1, 10, 1))
	if err := h.s.SaveSnapshot(snapshot(7, 1, []uint64{1}, "state at 7")); err != nil {
		t.Fatalf("SaveSnapshot: %v", err)
	}
	h.save(nil, entries(5, 7, 2))
	want := logState{first: 1, ents: entries(1, 10, 1)}
	checkLog(t, h.s, want)

	h.save(nil, entries(6, 8, 3))
	want.ents = append(entries(1, 7, 1), entries(8, 8, 3)...)
	checkLog(t, h.s, want)
	h.reopen()
	checkLog(t, h.s, want)
}

func testCompact(t *testing.T, h *harness) {
	wantIs(t, "Compact(0) of a new store", h.s.Compact(0), raft.ErrCompacted)
	h.save(nil, entries(1, 10, 1))
	wantIs(t, "Compact(3) without a snapshot", h.s.Compact(3), storage.ErrCompactBeyondSnapshot)
	checkLog(t, h.s, logState{first: 1, ents: entries(1, 10, 1)})

	if err := h.s.SaveSnapshot(snapshot(6, 1, []uint64{1}, "state at 6")); err != nil {
		t.Fatalf("SaveSnapshot: %v", err)
	}
	for _, i := range []uint64{7, 10, 11} {
		wantIs(t, "Compact past the snapshot", h.s.Compact(i), storage.ErrCompactBeyondSnapshot)
	}
	checkLog(t, h.s, logState{first: 1, ents: entries(1, 10, 1)})

	h.compact(2)
	want := logState{first: 3, prevTerm: 1, ents: entries(3, 10, 1)}
	checkLog(t, h.s, want)
	for round := range 2 {
		if round == 1 {
			h.reopen()
		}
		for _, i := range []uint64{0, 1, 2} {
			wantIs(t, "Compact of an index already compacted", h.s.Compact(i), raft.ErrCompacted)
		}
		wantIs(t, "Compact past the snapshot", h.s.Compact(7), storage.ErrCompactBeyondSnapshot)
		checkLog(t, h.s, want)
	}

	// Compacting in steps up to the snapshot.
	h.compact(4)
	h.compact(6)
	want = logState{first: 7, prevTerm: 1, ents: entries(7, 10, 1)}
	checkLog(t, h.s, want)
	wantIs(t, "Compact(6) again", h.s.Compact(6), raft.ErrCompacted)
	h.reopen()
	checkLog(t, h.s, want)
	checkSnapshot(t, h.s, snapshot(6, 1, []uint64{1}, "state at 6"))

	// The log keeps growing and overwriting after compaction.
	h.save(nil, entries(9, 12, 2))
	want.ents = append(entries(7, 8, 1), entries(9, 12, 2)...)
	checkLog(t, h.s, want)
	h.reopen()
	checkLog(t, h.s, want)
}

// testCompactAll compacts many times over a long log, each time behind a new
// snapshot, as a replica does, and reopens in between.
func testCompactAll(t *testing.T, h *harness) {
	const tail = 30
	var last uint64
	for round := uint64(1); round <= 8; round++ {
		h.save(hardState(round, 1, last), entries(last+1, last+100, round))
		last += 100
		snapIndex := last - 10
		if err := h.s.SaveSnapshot(snapshot(snapIndex, round, []uint64{1, 2, 3}, fmt.Sprintf("state at %d", snapIndex))); err != nil {
			t.Fatalf("SaveSnapshot(%d): %v", snapIndex, err)
		}
		h.compact(snapIndex - tail)
		if round%3 == 0 {
			h.reopen()
		}
		first, err := h.s.FirstIndex()
		if err != nil || first != snapIndex-tail+1 {
			t.Fatalf("FirstIndex() = %d, %v; want %d", first, err, snapIndex-tail+1)
		}
		got, err := h.s.Entries(first, last+1, noLimit)
		if err != nil {
			t.Fatalf("Entries(%d, %d): %v", first, last+1, err)
		}
		var want []*raftpb.Entry
		for i := first; i <= last; i++ {
			want = append(want, entry(i, 1+(i-1)/100))
		}
		checkEntries(t, "Entries of the retained log", got, want)
	}
}

// testLargeSnapshot saves a snapshot of several MiB and reads it back.
func testLargeSnapshot(t *testing.T, h *harness) {
	h.save(hardState(1, 1, 10), entries(1, 10, 1))
	data := make([]byte, 6<<20)
	for k := range data {
		data[k] = byte(k * 7 / 5)
	}
	snap := snapshot(8, 1, []uint64{1, 2, 3}, "")
	snap.Data = data
	if err := h.s.SaveSnapshot(snap); err != nil {
		t.Fatalf("SaveSnapshot: %v", err)
	}
	for round := range 2 {
		if round == 1 {
			h.reopen()
		}
		got, err := h.s.Snapshot()
		if err != nil {
			t.Fatalf("Snapshot: %v", err)
		}
		if !bytes.Equal(got.GetData(), data) || got.GetMetadata().GetIndex() != 8 {
			t.Fatalf("Snapshot() = index %d, %d bytes; want index 8, the %d bytes saved",
				got.GetMetadata().GetIndex(), len(got.GetData()), len(data))
		}
	}
}

func testIdentity(t *testing.T, h *harness) {
	id := storage.Identity{ClusterID: 0xc1, MemberID: 2}
	if err := h.s.SetIdentity(id); err != nil {
		t.Fatalf("SetIdentity: %v", err)
	}
	for round := range 2 {
		if round == 1 {
			h.reopen()
		}
		got, ok, err := h.s.Identity()
		if err != nil || !ok || got != id {
			t.Fatalf("Identity() = %v, %v, %v; want %v, true, nil", got, ok, err, id)
		}
		if err := h.s.SetIdentity(id); err != nil {
			t.Fatalf("SetIdentity of the recorded identity: %v", err)
		}
		for _, other := range []storage.Identity{
			{ClusterID: 0xc2, MemberID: 2},
			{ClusterID: 0xc1, MemberID: 3},
			{},
		} {
			wantIs(t, "SetIdentity of another identity", h.s.SetIdentity(other), storage.ErrIdentityMismatch)
		}
		if got, _, _ := h.s.Identity(); got != id {
			t.Fatalf("Identity() after a mismatch = %v, want %v", got, id)
		}
	}
}

// testBadInput checks that invalid arguments return errors, leave the store
// unchanged and never panic.
func testBadInput(t *testing.T, h *harness) {
	h.save(nil, entries(1, 5, 1))
	want := logState{first: 1, ents: entries(1, 5, 1)}
	noPanic := func(what string, f func() error) {
		t.Helper()
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("%s panicked: %v", what, r)
				}
			}()
			err = f()
		}()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
	}
	noPanic("Save with a nil entry", func() error { return h.s.Save(nil, []*raftpb.Entry{entry(6, 1), nil}) })
	noPanic("Save of a lone nil entry", func() error { return h.s.Save(nil, []*raftpb.Entry{nil}) })
	noPanic("SaveSnapshot(nil)", func() error { return h.s.SaveSnapshot(nil) })
	for _, c := range []struct {
		what string
		ents []*raftpb.Entry
	}{{"commit-only Save past the last index", nil}, {"Save committing past its entries", entries(6, 7, 1)}} {
		if err := h.s.Save(hardState(1, 1, 9), c.ents); !errors.Is(err, storage.ErrCommitBeyondLog) {
			t.Fatalf("%s: %v, want ErrCommitBeyondLog", c.what, err)
		}
	}
	noPanic("Entries(4, 3)", func() error { return errOf(h.s.Entries(4, 3, noLimit)) })
	noPanic("Entries(2, 100)", func() error { return errOf(h.s.Entries(2, 100, noLimit)) })
	noPanic("Entries(7, 8)", func() error { return errOf(h.s.Entries(7, 8, noLimit)) })
	checkLog(t, h.s, want)
	h.reopen() // nothing bad was kept for Close to write
	checkLog(t, h.s, want)
}

// testManyEntries exceeds what a backend would reasonably cache in memory
// and reads across the whole log.
func testManyEntries(t *testing.T, h *harness) {
	const n, batch = 6000, 200
	var all []*raftpb.Entry
	for lo := uint64(1); lo <= n; lo += batch {
		ents := entries(lo, lo+batch-1, 1+lo/1000)
		h.save(hardState(1+lo/1000, 1, 0), ents)
		all = append(all, ents...)
	}
	want := logState{first: 1, ents: all}
	checkLog(t, h.s, want)
	h.reopen()
	checkLog(t, h.s, want)
	var maxSize uint64
	for _, e := range all[9:109] {
		maxSize += uint64(proto.Size(e))
	}
	got, err := h.s.Entries(10, n+1, maxSize)
	if err != nil {
		t.Fatal(err)
	}
	checkEntries(t, "Entries(10, n+1, size of 100 entries)", got, all[9:109])

	// Overwrite deep inside the log, below any reasonable cache.
	h.save(nil, entries(100, 110, 50))
	want.ents = append(all[:99:99], entries(100, 110, 50)...)
	checkLog(t, h.s, want)
	h.reopen()
	checkLog(t, h.s, want)

	if err := h.s.SaveSnapshot(snapshot(105, 50, []uint64{1}, "state at 105")); err != nil {
		t.Fatalf("SaveSnapshot: %v", err)
	}
	checkLog(t, h.s, want)
	h.compact(50)
	want = logState{first: 51, prevTerm: 1, ents: want.ents[50:]}
	checkLog(t, h.s, want)
	h.compact(105)
	want = logState{first: 106, prevTerm: 50, ents: entries(106, 110, 50)}
	checkLog(t, h.s, want)
	h.reopen()
	checkLog(t, h.s, want)
}

// testReopen writes every kind of record and checks all of it after reopen.
func testReopen(t *testing.T, h *harness) {
	id := storage.Identity{ClusterID: 7, MemberID: 3}
	if err := h.s.SetIdentity(id); err != nil {
		t.Fatal(err)
	}
	h.save(hardState(1, 1, 0), entries(1, 20, 1))
	snap := snapshot(10, 1, []uint64{1, 2, 3}, "state at 10")
	snap.Metadata.ConfState.Learners = []uint64{4}
	if err := h.s.SaveSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	h.compact(6)
	h.save(hardState(2, 3, 15), entries(18, 25, 2))
	want := logState{first: 7, prevTerm: 1, ents: append(entries(7, 17, 1), entries(18, 25, 2)...)}

	for range 3 {
		h.reopen()
		checkLog(t, h.s, want)
		checkHardState(t, h.s, hardState(2, 3, 15))
		checkSnapshot(t, h.s, snap)
		if got, ok, err := h.s.Identity(); got != id || !ok || err != nil {
			t.Fatalf("Identity() = %v, %v, %v; want %v", got, ok, err, id)
		}
	}
}

// testCloseWritesCommit: a commit-only hard state, which Save defers to
// the next write, is written by Close, so that a replica restarted after a
// clean stop does not start from an older commit index.
func testCloseWritesCommit(t *testing.T, h *harness) {
	h.save(hardState(1, 1, 2), entries(1, 10, 1))
	h.save(hardState(1, 1, 8), nil)
	checkHardState(t, h.s, hardState(1, 1, 8))
	h.reopen()
	checkHardState(t, h.s, hardState(1, 1, 8))
	checkLog(t, h.s, logState{first: 1, ents: entries(1, 10, 1)})
	// Nothing pending: Close writes nothing and the state stays.
	h.reopen()
	checkHardState(t, h.s, hardState(1, 1, 8))
}

func errOf(_ []*raftpb.Entry, err error) error {
	if err == nil {
		return errors.New("no error")
	}
	return err
}
