package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
)

// roundTrip writes m's snapshot and restores it.
func roundTrip(t interface{ Fatalf(string, ...any) }, m *Machine) *Machine {
	var buf bytes.Buffer
	if _, err := m.Snapshot().WriteTo(&buf); err != nil {
		t.Fatalf("WriteTo: %v", err)
	}
	r, err := Restore(buf.Bytes(), m.Limits())
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if got, want := dump(r), dump(m); got != want {
		t.Fatalf("restored machine differs:\n%s\nwant:\n%s", got, want)
	}
	return r
}

func snapshotMachine(t *testing.T) *Machine {
	m := New(Limits{})
	apply := func(index uint64, c Command) {
		if res, _ := m.Apply(index, 1, &c); res.Code > CodeQueued {
			t.Fatalf("setup %v: %v", c.Op, res.Code)
		}
	}
	apply(1, Command{Op: OpOpenSession, TTL: 10e9})
	apply(2, Command{Op: OpOpenSession, TTL: 20e9})
	apply(3, Command{Op: OpAcquire, Session: 1, Seq: 1, Name: "a"})
	apply(4, Command{Op: OpAcquire, Session: 2, Seq: 1, Name: "a", Value: []byte("wv")})
	apply(5, Command{Op: OpAcquire, Session: 2, Seq: 2, Done: 1, Name: RolePrefix + "r", Value: []byte("v")})
	for i := range 300 {
		apply(uint64(6+i), Command{Op: OpAcquire, Session: 1, Seq: uint64(2 + i), Done: uint64(2 + i), Name: fmt.Sprint("k", i)})
	}
	return m
}

func TestSnapshotRoundTrip(t *testing.T) {
	m := snapshotMachine(t)
	r := roundTrip(t, m)
	if r.Applied() != m.Applied() {
		t.Fatalf("applied %d, want %d", r.Applied(), m.Applied())
	}
	// Both go on identically: the waiter and its value are restored.
	c := Command{Op: OpRelease, Session: 1, Seq: 400, Name: "a", Token: 3}
	res1, ev1 := m.Apply(1000, 1, &c)
	res2, ev2 := r.Apply(1000, 1, &c)
	if res1 != res2 || fmt.Sprint(ev1) != fmt.Sprint(ev2) || dump(m) != dump(r) {
		t.Fatalf("diverged after restore: %v %v / %v %v", res1, ev1, res2, ev2)
	}
}

// The snapshot is a point-in-time view: applies after Snapshot do not show
// in what WriteTo writes, and the live machine is unaffected by the freeze.
func TestSnapshotIsolation(t *testing.T) {
	m := snapshotMachine(t)
	before := dump(m)
	snap := m.Snapshot()
	for i := range 300 {
		c := Command{Op: OpRelease, Session: 1, Seq: uint64(1000 + i), Done: uint64(1000 + i), Name: fmt.Sprint("k", i), Token: uint64(6 + i)}
		if res, _ := m.Apply(uint64(2000+i), 1, &c); res.Code != CodeOK {
			t.Fatalf("release k%d: %v", i, res.Code)
		}
	}
	var buf bytes.Buffer
	if _, err := snap.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	r, err := Restore(buf.Bytes(), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if dump(r) != before {
		t.Fatal("snapshot saw writes made after it was taken")
	}
	if m.NumLocks() != 2 {
		t.Fatalf("live machine has %d locks, want 2", m.NumLocks())
	}
}

func TestRestoreRejectsCorruption(t *testing.T) {
	var buf bytes.Buffer
	if _, err := snapshotMachine(t).Snapshot().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"truncated", good[:len(good)/2]},
		{"flipped byte", func() []byte { b := bytes.Clone(good); b[len(b)/3] ^= 0x40; return b }()},
		{"bad magic", func() []byte { b := bytes.Clone(good); b[0] = 'X'; return b }()},
	} {
		if _, err := Restore(tc.data, Limits{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", tc.name, err)
		}
	}
}

func FuzzRestore(f *testing.F) {
	var buf bytes.Buffer
	m := New(Limits{})
	m.Apply(1, 1, &Command{Op: OpOpenSession, TTL: 10e9})
	m.Apply(2, 1, &Command{Op: OpAcquire, Session: 1, Seq: 1, Name: "a"})
	m.Snapshot().WriteTo(&buf)
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Restore(data, Limits{})
		if err == nil {
			if err := checkInvariants(m); err != nil {
				t.Fatalf("restored an inconsistent machine: %v", err)
			}
		}
	})
}
