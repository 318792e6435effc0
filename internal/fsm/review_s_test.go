package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// Review S: opens carry a client-chosen OpenID, and an open whose OpenID
// names a live session returns that session instead of a second one.

// An OpOpenSession with an OpenID encodes as format version 3 and decodes
// to itself, with or without stamped limits; Encode(Decode(data)) == data.
func TestReviewSOpenIDRoundTrip(t *testing.T) {
	for _, cmd := range []Command{
		{Op: OpOpenSession, TTL: 10e9, Nonce: 42, OpenID: 1},
		{Op: OpOpenSession, TTL: 10e9, Nonce: 42, OpenID: math.MaxUint64, Limits: Stamped{MaxSessions: 1_000_000}},
		{Op: OpOpenSession, TTL: -1, OpenID: 300},
	} {
		data := Encode(&cmd)
		if data[0] != formatV3 {
			t.Errorf("%+v: written as version %d, want 3", cmd, data[0])
		}
		var got Command
		if err := Decode(data, &got); err != nil {
			t.Fatalf("%+v: %v", cmd, err)
		}
		if !equalCommand(got, cmd) {
			t.Errorf("decoded %+v, want %+v", got, cmd)
		}
		if again := Encode(&got); !bytes.Equal(again, data) {
			t.Errorf("%+v: re-encoded %x, want %x", cmd, again, data)
		}
	}
	// OpenID matters for opens only: another op does not write it.
	rel := Command{Op: OpRelease, Session: 1, Seq: 2, Name: "x", Token: 3, OpenID: 9}
	var got Command
	if err := Decode(Encode(&rel), &got); err != nil || got.OpenID != 0 || Encode(&rel)[0] != formatV1 {
		t.Errorf("release with an OpenID: %+v, %v, version %d", got, err, Encode(&rel)[0])
	}
}

// Opens written before open IDs (versions 1 and 2, as a leader without
// them logged) decode with OpenID 0, which deduplicates nothing.
func TestReviewSOldOpensDecodeWithoutOpenID(t *testing.T) {
	v1 := []byte{formatV1, byte(OpOpenSession)}
	v1 = binary.AppendVarint(v1, 10e9)
	v1 = binary.AppendUvarint(v1, 42) // nonce
	v2 := append([]byte{formatV2}, v1[1:]...)
	v2 = binary.AppendUvarint(v2, 1000) // max sessions
	for _, data := range [][]byte{v1, v2} {
		var got Command
		if err := Decode(data, &got); err != nil {
			t.Fatalf("%x: %v", data, err)
		}
		if got.Op != OpOpenSession || got.TTL != 10e9 || got.Nonce != 42 || got.OpenID != 0 {
			t.Errorf("%x decoded to %+v", data, got)
		}
	}
	m := New(Limits{})
	for i := range uint64(2) {
		_, res, _ := m.ApplyEntry(i+1, 1, v1)
		if res.Code != CodeOK || res.Session != i+1 {
			t.Errorf("old open at %d: %+v", i+1, res)
		}
	}
	if m.NumSessions() != 2 {
		t.Errorf("%d sessions after two old opens, want 2", m.NumSessions())
	}
}

// Version 3 encodings that Encode never writes are corrupt: a zero open
// ID (that open is version 1 or 2), an op other than an open, a missing
// open ID, trailing bytes.
func TestReviewSDecodeRejectsBadVersion3(t *testing.T) {
	open := Encode(&Command{Op: OpOpenSession, TTL: 10e9, Nonce: 1, OpenID: 5})
	zero := append(bytes.Clone(open[:len(open)-1]), 0)
	rel := Encode(&Command{Op: OpRelease, Session: 1, Seq: 1, Name: "a", Token: 1, Limits: Stamped{}, Listed: true})
	rel[0] = formatV3
	closeV3 := append([]byte{formatV3}, Encode(&Command{Op: OpCloseSession, Session: 1, Seq: 1, Listed: true})[1:]...)
	for name, data := range map[string][]byte{
		"zero open id":  zero,
		"release":       rel,
		"close":         append(closeV3, 5),
		"no open id":    open[:len(open)-1],
		"trailing byte": append(bytes.Clone(open), 0),
		"version 4":     append([]byte{4}, open[1:]...),
	} {
		var got Command
		if err := Decode(data, &got); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s (%x): %v, want ErrCorrupt", name, data, err)
		}
	}
}

// A snapshot keeps each session's open ID: a retried open after a restore
// (a replica that caught up from a snapshot, then leads) still returns
// the session, and the ended session's ID opens anew.
func TestReviewSSnapshotKeepsOpenIDs(t *testing.T) {
	m := New(Limits{})
	m.Apply(1, 1, &Command{Op: OpOpenSession, TTL: 10e9, OpenID: 77})
	m.Apply(2, 1, &Command{Op: OpOpenSession, TTL: 10e9})
	m.Apply(3, 1, &Command{Op: OpOpenSession, TTL: 20e9, OpenID: 78})
	m.Apply(4, 1, &Command{Op: OpAcquire, Session: 1, Seq: 1, Name: "a"})
	r := roundTrip(t, m)
	if res, _ := r.Apply(5, 1, &Command{Op: OpOpenSession, TTL: 10e9, OpenID: 77}); res.Code != CodeOK || res.Session != 1 {
		t.Errorf("retried open after restore: %+v, want session 1", res)
	}
	if res, _ := r.Apply(6, 1, &Command{Op: OpOpenSession, TTL: 20e9, OpenID: 78}); res.Code != CodeOK || res.Session != 3 {
		t.Errorf("retried open after restore: %+v, want session 3", res)
	}
	if r.NumSessions() != 3 {
		t.Errorf("%d sessions, want 3", r.NumSessions())
	}
	r.Apply(7, 1, &Command{Op: OpCloseSession, Session: 1, Seq: 2})
	r = roundTrip(t, r)
	if res, _ := r.Apply(8, 1, &Command{Op: OpOpenSession, TTL: 10e9, OpenID: 77}); res.Code != CodeOK || res.Session != 8 {
		t.Errorf("open with the ID of a closed session: %+v, want session 8", res)
	}
}

// A version 2 image (before open IDs) restores with every open ID 0: an
// open then creates a session, whatever its OpenID.
func TestReviewSRestoreVersion2(t *testing.T) {
	// Version 2: its magic, and no open ID after the session's ttl.
	m, v3, head := oneSessionImage(t, snapshotMagicV2)
	if v3[len(head)] != 0 {
		t.Fatalf("unexpected version 3 layout: %x", v3)
	}
	r, err := Restore(sealImage(append(head, v3[len(head)+1:len(v3)-4]...)), Limits{})
	if err != nil {
		t.Fatalf("Restore(version 2): %v", err)
	}
	if got, want := dump(r), dump(m); got != want {
		t.Fatalf("restored from version 2:\n%s\nwant:\n%s", got, want)
	}
	if res, _ := r.Apply(3, 1, &Command{Op: OpOpenSession, TTL: 10e9, OpenID: 1}); res.Session != 3 {
		t.Errorf("open after a version 2 restore: %+v, want session 3", res)
	}
}

// An image in which two sessions have one open ID is corrupt.
func TestReviewSRestoreRejectsDuplicateOpenID(t *testing.T) {
	m := New(Limits{})
	m.Apply(1, 1, &Command{Op: OpOpenSession, TTL: 10e9, OpenID: 5})
	m.Apply(2, 1, &Command{Op: OpOpenSession, TTL: 10e9, OpenID: 6})
	m.sessions[2].openID = 5 // what Apply never does
	var buf bytes.Buffer
	if _, err := m.Snapshot().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(buf.Bytes(), Limits{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Restore: %v, want ErrCorrupt", err)
	}
}
