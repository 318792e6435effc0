package fsm

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

// sampleCommands has one command of every op, with small and extreme values.
func sampleCommands() []Command {
	return []Command{
		{Op: OpOpenSession, TTL: 10e9, Nonce: 42},
		{Op: OpOpenSession, TTL: math.MinInt64, Nonce: math.MaxUint64},
		{Op: OpOpenSession, TTL: -1},
		{Op: OpAcquire, Session: 1, Seq: 1, Name: "a"},
		{Op: OpAcquire, Session: math.MaxUint64, Seq: math.MaxUint64, Done: math.MaxUint64, Name: "lock/é/🔒", Try: true},
		{Op: OpAcquire, Session: 1, Seq: 2, Name: ""},
		{Op: OpAcquire, Session: 1, Seq: 3, Name: "\x00\xff"},
		{Op: OpRelease, Session: 7, Seq: 300, Done: 299, Name: "b", Token: 1 << 40},
		{Op: OpWithdraw, Session: 7, Seq: 301, Done: 300, Name: "b"},
		{Op: OpWithdraw, Session: 7, Seq: 302, Done: 300, Name: "b", Target: 301},
		{Op: OpAcquire, Session: 1, Seq: 4, Name: "\x00role", Value: []byte("host:1")},
		{Op: OpProclaim, Session: 1, Seq: 5, Name: "\x00role", Token: 9, Value: []byte("host:2")},
		{Op: OpProclaim, Session: 1, Seq: 6, Name: "\x00role", Token: 9},
		{Op: OpRevoke, Nonce: 77, IDs: []uint64{3, 1}},
		{Op: OpCloseSession, Session: 7, Seq: 303, Done: 303},
		{Op: OpExpire, Term: 3},
		{Op: OpExpire, Term: math.MaxUint64, IDs: []uint64{5, 1, math.MaxUint64, 1}},
	}
}

// stampedCommands have stamped limits (format version 2).
func stampedCommands() []Command {
	return []Command{
		{Op: OpOpenSession, TTL: 10e9, Nonce: 42, Limits: Stamped{MaxSessions: 1_000_000}},
		{Op: OpAcquire, Session: 1, Seq: 1, Name: "a", Limits: Stamped{MaxNameBytes: 256, MaxLocksPerSession: 10_000, MaxWaitersPerLock: 10_000}},
		{Op: OpAcquire, Session: 1, Seq: 2, Name: "b", Try: true, Value: []byte("v"), Limits: Stamped{MaxLocksPerSession: 1}},
		{Op: OpAcquire, Session: 1, Seq: 3, Name: "c", Limits: Stamped{MaxNameBytes: math.MaxUint64}},
		{Op: OpAcquire, Session: 1, Seq: 9, Done: 2, Name: "c", Listed: true, Pending: []uint64{2, 5, 8}, Limits: Stamped{MaxLocksPerSession: 3}},
		{Op: OpRelease, Session: 7, Seq: 300, Done: 299, Name: "b", Token: 1, Listed: true, Pending: []uint64{299}},
		{Op: OpWithdraw, Session: 7, Seq: 302, Done: 300, Name: "b", Target: 301, Listed: true, Pending: []uint64{300, 301}},
		{Op: OpProclaim, Session: 1, Seq: 6, Name: "\x00role", Token: 9, Listed: true},
		{Op: OpCloseSession, Session: 7, Seq: 303, Done: 303, Listed: true},
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for i, cmd := range append(sampleCommands(), stampedCommands()...) {
		data := Encode(&cmd)
		version := formatV1
		if i >= len(sampleCommands()) {
			version = formatV2
		}
		if data[0] != version || Op(data[1]) != cmd.Op {
			t.Errorf("%+v: encoding starts %x", cmd, data[:2])
		}
		var got Command
		if err := Decode(data, &got); err != nil {
			t.Fatalf("%+v: %v", cmd, err)
		}
		if !equalCommand(got, cmd) {
			t.Errorf("round trip: %+v became %+v", cmd, got)
		}
		if app := AppendEncode([]byte("prefix"), &cmd); !bytes.Equal(app, append([]byte("prefix"), data...)) {
			t.Errorf("%+v: AppendEncode %x, Encode %x", cmd, app, data)
		}
	}
}

// TestEncodeOnlyOpFields checks that fields that do not matter for the op are
// neither written nor decoded.
func TestEncodeOnlyOpFields(t *testing.T) {
	cmd := Command{Op: OpCloseSession, Session: 1, Seq: 2, Done: 1, Name: "x", Try: true, Token: 9, TTL: 9, Nonce: 9, IDs: []uint64{9}, Term: 9, Target: 9}
	var got Command
	if err := Decode(Encode(&cmd), &got); err != nil {
		t.Fatal(err)
	}
	if want := (Command{Op: OpCloseSession, Session: 1, Seq: 2, Done: 1}); !equalCommand(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	// Limits an op does not check are not stamped: a release with limits
	// set is written as version 1, and an open session keeps only
	// MaxSessions.
	all := Stamped{MaxNameBytes: 1, MaxSessions: 2, MaxLocksPerSession: 3, MaxWaitersPerLock: 4}
	rel := Command{Op: OpRelease, Session: 1, Seq: 2, Name: "x", Token: 3, Limits: all}
	if data := Encode(&rel); data[0] != formatV1 {
		t.Errorf("a release with limits set is written as version %d", data[0])
	}
	open := Command{Op: OpOpenSession, TTL: 1, Nonce: 1, Limits: all}
	if err := Decode(Encode(&open), &got); err != nil {
		t.Fatal(err)
	}
	if want := (Stamped{MaxSessions: 2}); got.Limits != want {
		t.Errorf("open session decoded with limits %+v, want %+v", got.Limits, want)
	}
}

func TestDecodeRejects(t *testing.T) {
	acquire := Encode(&Command{Op: OpAcquire, Session: 1, Seq: 1, Name: "ab"})
	stamped := Encode(&Command{Op: OpAcquire, Session: 1, Seq: 1, Name: "ab", Limits: Stamped{MaxLocksPerSession: 5}})
	release := Encode(&Command{Op: OpRelease, Session: 1, Seq: 1, Name: "ab", Token: 1})
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"nil", nil},
		{"empty", []byte{}},
		{"version 0", []byte{0, byte(OpAcquire)}},
		{"version 2 without limits", append([]byte{formatV2}, acquire[1:]...)},
		{"version 2, limits all zero", append(append([]byte{formatV2}, acquire[1:]...), 0, 0, 0)},
		{"version 2, truncated limits", stamped[:len(stamped)-1]},
		{"version 2, trailing byte", append(bytes.Clone(stamped), 0)},
		{"version 2, a release not listed", append(append([]byte{formatV2}, release[1:]...), 0)},
		{"version 2 for an expire", []byte{formatV2, byte(OpExpire), 1, 0, 1}},
		{"pending not increasing", append(append([]byte{formatV2}, release[1:]...), 3, 0, 0)},
		{"pending at seq", append(append([]byte{formatV2}, release[1:]...), 2, 1)},
		{"pending count over data", append(append([]byte{formatV2}, release[1:]...), 9, 0)},
		{"version 3", append([]byte{3}, acquire[1:]...)},
		{"no op", []byte{formatV1}},
		{"op 0", []byte{formatV1, 0}},
		{"op 7", []byte{formatV1, 7}},
		{"nil command encoded", Encode(nil)},
		{"truncated", acquire[:len(acquire)-1]},
		{"truncated name", acquire[:len(acquire)-2]},
		{"trailing byte", append(bytes.Clone(acquire), 0)},
		{"unknown flag", append(bytes.Clone(acquire[:len(acquire)-1]), 2)},
		{"name longer than data", []byte{formatV1, byte(OpAcquire), 1, 1, 0, 0x80, 0x80, 0x04, 'a', 0}},
		{"huge name length", []byte{formatV1, byte(OpWithdraw), 1, 1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"varint overflow", []byte{formatV1, byte(OpCloseSession), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 1, 0}},
		{"varint too long", []byte{formatV1, byte(OpCloseSession), 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 1, 0}},
		{"non-minimal varint", []byte{formatV1, byte(OpCloseSession), 0x81, 0x00, 1, 0}},
		{"ids count over data", []byte{formatV1, byte(OpExpire), 1, 3, 1, 2}},
		{"huge ids count", []byte{formatV1, byte(OpExpire), 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 1}},
		{"truncated id", []byte{formatV1, byte(OpExpire), 1, 2, 1, 0x80}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := Command{Op: OpAcquire, Name: "stale", IDs: []uint64{1}}
			err := Decode(tc.data, &cmd)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Decode(%x) = %v, want ErrCorrupt", tc.data, err)
			}
			if !equalCommand(cmd, Command{}) {
				t.Errorf("Decode(%x) left %+v", tc.data, cmd)
			}
		})
	}
	if err := Decode(acquire, nil); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Decode into nil = %v", err)
	}
}

// TestDecodeCopies checks that a decoded command does not alias its input:
// raft may reuse an entry's buffer after apply.
func TestDecodeCopies(t *testing.T) {
	data := Encode(&Command{Op: OpAcquire, Session: 1, Seq: 1, Name: "abc"})
	var cmd Command
	if err := Decode(data, &cmd); err != nil {
		t.Fatal(err)
	}
	for i := range data {
		data[i] = 'z'
	}
	if cmd.Name != "abc" {
		t.Errorf("name changed with its input: %q", cmd.Name)
	}
}

// FuzzDecode checks that Decode never panics, and that what it accepts is
// the unique encoding of the command it returns.
func FuzzDecode(f *testing.F) {
	for _, cmd := range append(sampleCommands(), stampedCommands()...) {
		f.Add(Encode(&cmd))
	}
	f.Add([]byte{})
	f.Add([]byte{formatV1, byte(OpExpire), 1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		var cmd Command
		if err := Decode(data, &cmd); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Decode(%x) = %v, not ErrCorrupt", data, err)
			}
			return
		}
		again := Encode(&cmd)
		if !bytes.Equal(again, data) {
			t.Fatalf("Decode(%x) = %+v, which encodes to %x", data, cmd, again)
		}
		var cmd2 Command
		if err := Decode(again, &cmd2); err != nil || !equalCommand(cmd, cmd2) {
			t.Fatalf("round trip of %+v: %+v, %v", cmd, cmd2, err)
		}
		// Whatever decodes applies without panicking.
		m := New(Limits{})
		m.Apply(1, 1, &Command{Op: OpOpenSession, TTL: 10e9})
		m.ApplyEntry(2, 1, data)
		if err := checkInvariants(m); err != nil {
			t.Fatal(err)
		}
	})
}
