package fsm

import "testing"

// Review AC (mutation sweep of invariants 1-6).

// TestReviewACLateListRevivesNoRetiredSeq checks invariant 6 against a
// command that arrives after a later one: a listed command's Pending that
// names a seq an earlier-applied listed command already retired (it lies
// below the session's hi and is not a hole) must not make that seq a hole
// again. If it did, a late copy of the retired request (its outcome
// forgotten) would take effect a second time.
func TestReviewACLateListRevivesNoRetiredSeq(t *testing.T) {
	m := New(Limits{})
	idx := uint64(0)
	apply := func(cmd Command) Result {
		t.Helper()
		idx++
		res, _ := m.Apply(idx, 1, &cmd)
		if err := checkInvariants(m); err != nil {
			t.Fatalf("after entry %d (%+v): %v", idx, cmd, err)
		}
		return res
	}
	const ttl = 10e9
	holder := apply(Command{Op: OpOpenSession, TTL: ttl}).Session
	s := apply(Command{Op: OpOpenSession, TTL: ttl}).Session
	apply(Command{Op: OpAcquire, Session: holder, Seq: 1, Name: "a"})
	// Seq 2 waits for a and stays in flight throughout.
	if r := apply(Command{Op: OpAcquire, Session: s, Seq: 2, Done: 1, Name: "a"}); r.Code != CodeQueued {
		t.Fatalf("acquire a: %+v", r)
	}
	// Seq 3 takes b, seq 4 releases it.
	r := apply(Command{Op: OpAcquire, Session: s, Seq: 3, Done: 2, Listed: true, Pending: []uint64{2}, Name: "b"})
	if r.Code != CodeOK {
		t.Fatalf("acquire b: %+v", r)
	}
	if r := apply(Command{Op: OpRelease, Session: s, Seq: 4, Done: 2, Listed: true, Pending: []uint64{2}, Name: "b", Token: r.Token}); r.Code != CodeOK {
		t.Fatalf("release b: %+v", r)
	}
	// Seq 7, sent after 3 was answered, lists 2 and 6 in flight: 3 is
	// retired (below hi 7, not a hole).
	apply(Command{Op: OpAcquire, Session: s, Seq: 7, Done: 2, Listed: true, Pending: []uint64{2, 6}, Name: "c"})
	// Seq 6, sent before 3 was answered, arrives after 7 and lists 3.
	apply(Command{Op: OpAcquire, Session: s, Seq: 6, Done: 2, Listed: true, Pending: []uint64{2, 3}, Name: "d"})
	// A late copy of seq 3 must take no effect: b stays free.
	if r := apply(Command{Op: OpAcquire, Session: s, Seq: 3, Done: 2, Listed: true, Pending: []uint64{2}, Name: "b"}); r.Code != CodeInvalid {
		t.Errorf("late copy of retired seq 3: %+v, want CodeInvalid", r)
	}
	if h := m.HolderID("b"); h != 0 {
		t.Errorf("b held by %d after a late copy of a retired acquire, want free", h)
	}
}
