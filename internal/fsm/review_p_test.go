package fsm

// Review P: the machine's own bound on a leadership's value (the service
// checks it first, so only an entry the service did not check, such as
// one of another version's leader, reaches it).

import (
	"bytes"
	"testing"
)

// An acquire (a candidacy) or a proclaim with a value over MaxValueBytes is
// CodeInvalid (remembered as its outcome) and changes nothing else: no
// grant, no queue place, the published value kept.
func TestReviewPValueOverLimitChangesNothing(t *testing.T) {
	m := New(Limits{MaxValueBytes: 8})
	role := RolePrefix + "r"
	apply := func(i uint64, cmd Command) Result {
		t.Helper()
		res, _ := m.Apply(i, 1, &cmd)
		return res
	}
	if r := apply(1, Command{Op: OpOpenSession, TTL: 10e9}); r.Code != CodeOK {
		t.Fatalf("open: %+v", r)
	}
	if r := apply(2, Command{Op: OpAcquire, Session: 1, Seq: 1, Name: role, Value: make([]byte, 9)}); r.Code != CodeInvalid {
		t.Fatalf("acquire with a 9-byte value (limit 8): %+v, want CodeInvalid", r)
	}
	if li := m.Holder(role); li.Holder != 0 || len(li.Waiters) != 0 {
		t.Fatalf("a refused acquire changed the lock table: %+v", li)
	}
	r := apply(3, Command{Op: OpAcquire, Session: 1, Seq: 2, Name: role, Value: []byte("v1")})
	if r.Code != CodeOK {
		t.Fatalf("acquire: %+v", r)
	}
	if r := apply(4, Command{Op: OpProclaim, Session: 1, Seq: 3, Name: role, Token: r.Token, Value: make([]byte, 9)}); r.Code != CodeInvalid {
		t.Fatalf("proclaim of a 9-byte value (limit 8): %+v, want CodeInvalid", r)
	}
	if v := m.Holder(role).Value; !bytes.Equal(v, []byte("v1")) {
		t.Fatalf("a refused proclaim changed the value to %q", v)
	}
}
