package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// ErrCorrupt is returned (wrapped with the detail: what is wrong, at which
// byte offset) by Decode for data that is not a command written by Encode.
var ErrCorrupt = errors.New("quorumlock: corrupt command")

// formatV1 is the first byte of an encoded command without a version 2
// tail, formatV2 of one with it, formatV3 of an OpOpenSession with an
// OpenID.
const (
	formatV1 byte = 1
	formatV2 byte = 2
	formatV3 byte = 3
)

// The encoding, version 1. A uvarint is encoding/binary's, in its shortest
// form; a varint is its zig-zag signed form; a string is a uvarint length
// followed by that many bytes.
//
//	byte    version (1)
//	byte    Op
//	then, by Op:
//	OpOpenSession   varint TTL, uvarint Nonce
//	OpAcquire       uvarint Session, Seq, Done; string Name; byte flags (bit 0: Try,
//	                bit 1: a Value follows); [string Value]
//	OpProclaim      uvarint Session, Seq, Done; string Name; uvarint Token; string Value
//	OpRelease       uvarint Session, Seq, Done; string Name; uvarint Token
//	OpWithdraw      uvarint Session, Seq, Done; string Name; uvarint Target
//	OpCloseSession  uvarint Session, Seq, Done
//	OpExpire        uvarint Term; uvarint count; count x uvarint ID
//	OpRevoke        uvarint Nonce; uvarint count; count x uvarint ID
//
// Version 2 is version 1 followed by a tail: for a command acting for a
// session (acquire, proclaim, release, withdraw, close session), the
// session's requests in flight (Command.Listed and Pending): a uvarint n,
// 0 when not listed, else n-1 uvarints, the pending seqs in increasing
// order, each below Seq; then the stamped limits (Command.Limits) the Op
// checks, each a uvarint (0: the machine's own limit):
//
//	OpOpenSession   uvarint MaxSessions
//	OpAcquire       uvarint MaxNameBytes, MaxLocksPerSession, MaxWaitersPerLock
//
// A command that is not listed and whose stamped limits are all zero is
// written as version 1, and only as version 1.
//
// Version 3, only for OpOpenSession, is version 2 followed by a uvarint
// OpenID, never 0. An OpOpenSession with an OpenID is written as version 3,
// and only as version 3; one without as version 1 or 2, which decode with
// OpenID 0 (no deduplication), as entries logged before version 3 did.
//
// Fields that do not matter for the Op are not written. Every Command value
// has exactly one encoding, so Encode(Decode(data)) == data for all data that
// Decode accepts.

const (
	flagTry   byte = 1
	flagValue byte = 2
)

// Encode returns the binary encoding of cmd (see AppendEncode).
func Encode(cmd *Command) []byte {
	return AppendEncode(make([]byte, 0, encodedSizeHint(cmd)), cmd)
}

func encodedSizeHint(cmd *Command) int {
	if cmd == nil {
		return 2
	}
	return 2 + 7*binary.MaxVarintLen64 + len(cmd.Name) + len(cmd.Value) + len(cmd.IDs)*binary.MaxVarintLen64
}

// AppendEncode appends the encoding of cmd to b and returns the extended
// slice. Only the fields that matter for cmd.Op are written (see the Op
// constants), so Decode restores those and leaves the others zero. A nil cmd
// or an unknown Op encodes to data that Decode rejects.
func AppendEncode(b []byte, cmd *Command) []byte {
	if cmd == nil {
		return append(b, formatV1, 0)
	}
	stamped := stampedFields(cmd)
	listed := cmd.Listed && actsForSession(cmd.Op)
	version := formatV1
	if listed || slices.ContainsFunc(stamped, func(v uint64) bool { return v != 0 }) {
		version = formatV2
	}
	if cmd.Op == OpOpenSession && cmd.OpenID != 0 {
		version = formatV3
	}
	b = append(b, version, byte(cmd.Op))
	switch cmd.Op {
	case OpOpenSession:
		b = binary.AppendVarint(b, cmd.TTL)
		b = binary.AppendUvarint(b, cmd.Nonce)
	case OpAcquire:
		b = appendSessionSeq(b, cmd)
		b = appendString(b, cmd.Name)
		var flags byte
		if cmd.Try {
			flags |= flagTry
		}
		if len(cmd.Value) > 0 {
			flags |= flagValue
		}
		b = append(b, flags)
		if len(cmd.Value) > 0 {
			b = appendString(b, string(cmd.Value))
		}
	case OpProclaim:
		b = appendSessionSeq(b, cmd)
		b = appendString(b, cmd.Name)
		b = binary.AppendUvarint(b, cmd.Token)
		b = appendString(b, string(cmd.Value))
	case OpRelease:
		b = appendSessionSeq(b, cmd)
		b = appendString(b, cmd.Name)
		b = binary.AppendUvarint(b, cmd.Token)
	case OpWithdraw:
		b = appendSessionSeq(b, cmd)
		b = appendString(b, cmd.Name)
		b = binary.AppendUvarint(b, cmd.Target)
	case OpCloseSession:
		b = appendSessionSeq(b, cmd)
	case OpExpire:
		b = binary.AppendUvarint(b, cmd.Term)
		b = appendIDs(b, cmd.IDs)
	case OpRevoke:
		b = binary.AppendUvarint(b, cmd.Nonce)
		b = appendIDs(b, cmd.IDs)
	}
	if version >= formatV2 {
		if actsForSession(cmd.Op) {
			if !listed {
				b = append(b, 0)
			} else {
				b = binary.AppendUvarint(b, uint64(len(cmd.Pending))+1)
				for _, p := range cmd.Pending {
					b = binary.AppendUvarint(b, p)
				}
			}
		}
		for _, v := range stamped {
			b = binary.AppendUvarint(b, v)
		}
	}
	if version == formatV3 {
		b = binary.AppendUvarint(b, cmd.OpenID)
	}
	return b
}

// actsForSession reports whether op acts for a session under its (Seq,
// Done) dedupe, and so may list its requests in flight.
func actsForSession(op Op) bool {
	switch op {
	case OpAcquire, OpProclaim, OpRelease, OpWithdraw, OpCloseSession:
		return true
	}
	return false
}

// stampedFields returns the stamped limits cmd.Op checks, in encoding
// order (nil for an Op that checks none).
func stampedFields(cmd *Command) []uint64 {
	switch cmd.Op {
	case OpOpenSession:
		return []uint64{cmd.Limits.MaxSessions}
	case OpAcquire:
		return []uint64{cmd.Limits.MaxNameBytes, cmd.Limits.MaxLocksPerSession, cmd.Limits.MaxWaitersPerLock}
	}
	return nil
}

func appendIDs(b []byte, ids []uint64) []byte {
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, id)
	}
	return b
}

func appendSessionSeq(b []byte, cmd *Command) []byte {
	b = binary.AppendUvarint(b, cmd.Session)
	b = binary.AppendUvarint(b, cmd.Seq)
	return binary.AppendUvarint(b, cmd.Done)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Decode parses data written by Encode into *cmd, overwriting every field.
// It does not retain data: the Name and IDs it sets are fresh copies.
//
// It returns an error wrapping ErrCorrupt, and leaves *cmd zero, when data is
// not exactly one command: empty, of an unknown format version or Op,
// truncated, with a varint that overflows 64 bits or is not in its shortest
// form, unknown flag bits, a length or count larger than the bytes left, or
// trailing bytes. A nil cmd also yields ErrCorrupt. Decode does not check the
// values themselves (a name's UTF-8 or length, a TTL's range): Apply does.
// Decode never panics.
func Decode(data []byte, cmd *Command) error {
	if cmd == nil {
		return fmt.Errorf("%w: nil *Command", ErrCorrupt)
	}
	*cmd = Command{}
	d := decoder{data: data}
	version := d.byte("version")
	if d.err == nil && (version < formatV1 || version > formatV3) {
		d.failAt(0, "unknown format version %d", version)
	}
	op := Op(d.byte("op"))
	if d.err == nil {
		cmd.Op = op
		switch op {
		case OpOpenSession:
			cmd.TTL = d.varint("ttl")
			cmd.Nonce = d.uvarint("nonce")
		case OpAcquire:
			d.sessionSeq(cmd)
			cmd.Name = d.name()
			flags := d.byte("flags")
			if d.err == nil && flags&^(flagTry|flagValue) != 0 {
				d.failAt(d.off-1, "unknown flags %#x", flags)
			}
			cmd.Try = flags&flagTry != 0
			if flags&flagValue != 0 {
				cmd.Value = d.value()
				if d.err == nil && len(cmd.Value) == 0 {
					d.fail("empty value with the value flag")
				}
			}
		case OpProclaim:
			d.sessionSeq(cmd)
			cmd.Name = d.name()
			cmd.Token = d.uvarint("token")
			cmd.Value = d.value()
		case OpRelease:
			d.sessionSeq(cmd)
			cmd.Name = d.name()
			cmd.Token = d.uvarint("token")
		case OpWithdraw:
			d.sessionSeq(cmd)
			cmd.Name = d.name()
			cmd.Target = d.uvarint("target")
		case OpCloseSession:
			d.sessionSeq(cmd)
		case OpExpire:
			cmd.Term = d.uvarint("term")
			cmd.IDs = d.ids()
		case OpRevoke:
			cmd.Nonce = d.uvarint("nonce")
			cmd.IDs = d.ids()
		default:
			d.failAt(1, "unknown op %d", op)
		}
		if version >= formatV2 {
			d.tail(cmd, version)
		}
	}
	if d.err == nil && d.off != len(d.data) {
		d.fail("%d trailing bytes", len(d.data)-d.off)
	}
	if d.err != nil {
		*cmd = Command{}
		return d.err
	}
	return nil
}

// decoder reads fields from data. After the first error every read returns
// zero and the error is kept.
type decoder struct {
	data []byte
	off  int
	err  error
}

// fail records an error at the current offset.
func (d *decoder) fail(format string, args ...any) {
	d.failAt(d.off, format, args...)
}

func (d *decoder) failAt(off int, format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: at offset %d: %s", ErrCorrupt, off, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) byte(field string) byte {
	if d.err != nil {
		return 0
	}
	if d.off >= len(d.data) {
		d.fail("truncated %s", field)
		return 0
	}
	v := d.data[d.off]
	d.off++
	return v
}

func (d *decoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.data[d.off:])
	switch {
	case n == 0:
		d.fail("truncated %s", field)
		return 0
	case n < 0:
		d.fail("%s overflows 64 bits", field)
		return 0
	case n > 1 && d.data[d.off+n-1] == 0:
		// A final zero group adds nothing: the value has a shorter form.
		d.fail("%s not in shortest form", field)
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) varint(field string) int64 {
	u := d.uvarint(field)
	v := int64(u >> 1)
	if u&1 != 0 {
		v = ^v
	}
	return v
}

// tail reads a version 2 or 3 command's tail: the listed requests in
// flight, the stamped limits and (version 3) the open ID.
func (d *decoder) tail(cmd *Command, version byte) {
	at := d.off
	if version == formatV3 && cmd.Op != OpOpenSession {
		d.failAt(0, "format version 3 for op %d, which has no open ID", cmd.Op)
		return
	}
	if actsForSession(cmd.Op) {
		n := d.uvarint("pending count")
		if d.err == nil && n > 0 {
			cmd.Listed = true
			n--
			// Each seq takes at least one byte.
			if left := uint64(len(d.data) - d.off); n > left {
				d.fail("pending count %d exceeds the %d bytes left", n, left)
				return
			}
			if n > 0 {
				cmd.Pending = make([]uint64, 0, n)
			}
			for range n {
				p := d.uvarint("pending seq")
				if d.err == nil && (p >= cmd.Seq || (len(cmd.Pending) > 0 && p <= cmd.Pending[len(cmd.Pending)-1])) {
					d.fail("pending seq %d not increasing or not below seq %d", p, cmd.Seq)
				}
				cmd.Pending = append(cmd.Pending, p)
			}
		}
	}
	var stamped bool
	read := func(field string) uint64 {
		v := d.uvarint(field)
		stamped = stamped || v != 0
		return v
	}
	switch cmd.Op {
	case OpOpenSession:
		cmd.Limits.MaxSessions = read("max sessions")
	case OpAcquire:
		cmd.Limits.MaxNameBytes = read("max name bytes")
		cmd.Limits.MaxLocksPerSession = read("max locks per session")
		cmd.Limits.MaxWaitersPerLock = read("max waiters per lock")
	default:
		if !actsForSession(cmd.Op) {
			d.failAt(0, "format version 2 for op %d, which has no tail", cmd.Op)
			return
		}
	}
	if version == formatV3 {
		at = d.off
		cmd.OpenID = d.uvarint("open id")
		if d.err == nil && cmd.OpenID == 0 {
			d.failAt(at, "format version 3 with a zero open ID")
		}
		return
	}
	if d.err == nil && !stamped && !cmd.Listed {
		d.failAt(at, "format version 2 with an empty tail")
	}
}

func (d *decoder) sessionSeq(cmd *Command) {
	cmd.Session = d.uvarint("session")
	cmd.Seq = d.uvarint("seq")
	cmd.Done = d.uvarint("done")
}

// name reads the lock name.
func (d *decoder) name() string { return string(d.bytes("name")) }

// value reads a value: nil when empty, else a fresh copy.
func (d *decoder) value() []byte {
	b := d.bytes("value")
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// bytes reads a length-prefixed byte string, aliasing data.
func (d *decoder) bytes(field string) []byte {
	n := d.uvarint(field + " length")
	if d.err != nil {
		return nil
	}
	if left := len(d.data) - d.off; n > uint64(left) {
		d.fail("%s length %d exceeds the %d bytes left", field, n, left)
		return nil
	}
	b := d.data[d.off : d.off+int(n)]
	d.off += int(n)
	return b
}

func (d *decoder) ids() []uint64 {
	n := d.uvarint("ids count")
	if d.err != nil || n == 0 {
		return nil
	}
	// Each ID takes at least one byte, which bounds the allocation by the
	// input size.
	if left := len(d.data) - d.off; n > uint64(left) {
		d.fail("ids count %d exceeds the %d bytes left", n, left)
		return nil
	}
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = d.uvarint("id")
	}
	return ids
}
