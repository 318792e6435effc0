package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
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
	// Session 2's acquire at seq 1 waits; listed requests leave a hole at
	// seq 1 and at seq 9 (in flight, not applied yet) below hi.
	apply(306, Command{Op: OpAcquire, Session: 2, Seq: 8, Done: 1, Listed: true, Pending: []uint64{1}, Name: "b"})
	apply(307, Command{Op: OpAcquire, Session: 2, Seq: 10, Done: 1, Listed: true, Pending: []uint64{1, 9}, Name: "c"})
	if s := m.sessions[2]; s.hi != 10 || len(s.holes) != 2 {
		t.Fatalf("setup: session 2 hi %d holes %v, want 10 and [1 9]", s.hi, s.holes)
	}
	return m
}

func TestSnapshotRoundTrip(t *testing.T) {
	m := snapshotMachine(t)
	r := roundTrip(t, m)
	if r.Applied() != m.Applied() {
		t.Fatalf("applied %d, want %d", r.Applied(), m.Applied())
	}
	// Both go on identically: the waiter and its value are restored, and
	// so are session 2's retired seqs (a copy of seq 5 takes no effect)
	// and its holes (seq 9 still applies).
	for i, c := range []Command{
		{Op: OpRelease, Session: 1, Seq: 400, Name: "a", Token: 3},
		{Op: OpRelease, Session: 2, Seq: 5, Done: 1, Name: "b", Token: 306},
		{Op: OpAcquire, Session: 2, Seq: 9, Done: 1, Listed: true, Pending: []uint64{1}, Name: "d"},
	} {
		res1, ev1 := m.Apply(uint64(1000+i), 1, &c)
		res2, ev2 := r.Apply(uint64(1000+i), 1, &c)
		if res1 != res2 || fmt.Sprint(ev1) != fmt.Sprint(ev2) || dump(m) != dump(r) {
			t.Fatalf("diverged after restore: %v %v / %v %v", res1, ev1, res2, ev2)
		}
		if want := []Code{CodeOK, CodeInvalid, CodeOK}[i]; res1.Code != want {
			t.Fatalf("%+v after restore: code %d, want %d", c, res1.Code, want)
		}
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
	if m.NumLocks() != 4 { // a, the role, b and c
		t.Fatalf("live machine has %d locks, want 4", m.NumLocks())
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

// oneSessionImage returns a machine whose session 1 (TTL 10 s) holds "a"
// by seq 3, its version 3 image, and the start of an older version's image
// of it with magic: up to the session's ttl, after which the versions
// differ.
func oneSessionImage(t *testing.T, magic []byte) (m *Machine, v3, head []byte) {
	t.Helper()
	m = New(Limits{})
	m.Apply(1, 1, &Command{Op: OpOpenSession, TTL: 10e9})
	m.Apply(2, 1, &Command{Op: OpAcquire, Session: 1, Seq: 3, Done: 3, Name: "a"})
	var buf bytes.Buffer
	if _, err := m.Snapshot().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	head = append(head, magic...)
	head = binary.AppendUvarint(head, 2)   // applied
	head = binary.AppendUvarint(head, 1)   // sessions
	head = binary.AppendUvarint(head, 1)   // id
	head = binary.AppendVarint(head, 10e9) // ttl
	return m, buf.Bytes(), head
}

// sealImage appends an image body's checksum.
func sealImage(body []byte) []byte {
	return binary.BigEndian.AppendUint32(body, crc32.Checksum(body, crcTable))
}

// A version 1 image (before sessions had hi and holes) restores, with
// every session's hi at its done.
func TestRestoreVersion1(t *testing.T) {
	// Rewrite a version 3 image as version 1: the magic's version byte, no
	// open ID after the session's ttl, and no hi and holes after its done
	// (3, then hi 3 and 0 holes).
	m, v3, head := oneSessionImage(t, snapshotMagicV1)
	ttlEnd := len(head)
	head = binary.AppendUvarint(head, 3) // done
	skip := len(head) + 3                // open ID (0), hi (3) and holes count (0)
	if v3[ttlEnd] != 0 || v3[skip-2] != 3 || v3[skip-1] != 0 {
		t.Fatalf("unexpected version 3 layout: %x", v3)
	}
	r, err := Restore(sealImage(append(head, v3[skip:len(v3)-4]...)), Limits{})
	if err != nil {
		t.Fatalf("Restore(version 1): %v", err)
	}
	if got, want := dump(r), dump(m); got != want {
		t.Fatalf("restored from version 1:\n%s\nwant:\n%s", got, want)
	}
}
