package fsm

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
)

// The snapshot format, version 3. Integers are uvarints (varint for the
// TTL), strings and byte strings are length-prefixed, as in the command
// encoding.
//
//	"QLSNAP" 0x03                magic and version
//	applied                       index of the last applied entry
//	sessions: count, then each    id, ttl, open ID (0: none), done, hi,
//	                              holes: count, then each seq; outcomes:
//	                              count, then each seq, token, code (byte),
//	                              name
//	queues:   count, then each    name, count, session IDs in grant order
//	values:   count, then each    name, value
//	waiting values: count, each   name, session, value
//	locks:    count, then each    name, holder, token
//	crc32c (4 bytes, big endian)  Castagnoli CRC of every byte before it
//
// Version 2 had no open IDs (every session's is 0: it deduplicates no
// open). Version 1 had no hi and holes either (a session's hi is its done,
// with no holes). Restore reads both.
//
// A session's set of lock names is not stored: Restore rebuilds it from the
// locks and queues, and the open IDs' index (Machine.opens) from the
// sessions.
var (
	snapshotMagic   = []byte("QLSNAP\x03")
	snapshotMagicV2 = []byte("QLSNAP\x02")
	snapshotMagicV1 = []byte("QLSNAP\x01")
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Snapshot is a point-in-time image of a Machine. Taking it (Machine.
// Snapshot) serialises the small parts on the apply goroutine and freezes
// the lock table, whose shards are then shared copy-on-write; WriteTo
// serialises the locks from any goroutine while apply goes on.
type Snapshot struct {
	applied uint64
	head    []byte
	locks   []map[string]lock
	nlocks  int
}

// Snapshot captures the machine's state as of Applied(). It must be called
// on the apply goroutine (like Apply); the returned Snapshot's WriteTo may
// run on any goroutine, concurrently with later applies. Its cost on the
// apply goroutine is proportional to the sessions, queues and values, not
// to the held locks.
func (m *Machine) Snapshot() *Snapshot {
	b := append([]byte(nil), snapshotMagic...)
	b = binary.AppendUvarint(b, m.applied)

	b = binary.AppendUvarint(b, uint64(len(m.sessions)))
	m.liveAfter(0, func(id uint64, s *session) bool {
		b = binary.AppendUvarint(b, id)
		b = binary.AppendVarint(b, s.ttl)
		b = binary.AppendUvarint(b, s.openID)
		b = binary.AppendUvarint(b, s.done)
		b = binary.AppendUvarint(b, s.hi)
		b = appendIDs(b, s.holes)
		b = binary.AppendUvarint(b, uint64(len(s.outcomes)))
		for _, o := range s.outcomes {
			b = binary.AppendUvarint(b, o.seq)
			b = binary.AppendUvarint(b, o.token)
			b = append(b, byte(o.code))
			b = appendString(b, o.name)
		}
		return true
	})

	b = binary.AppendUvarint(b, uint64(len(m.queues)))
	for _, name := range sortedKeys(m.queues) {
		b = appendString(b, name)
		b = appendIDs(b, m.queues[name])
	}
	b = binary.AppendUvarint(b, uint64(len(m.values)))
	for _, name := range sortedKeys(m.values) {
		b = appendString(b, name)
		b = appendString(b, string(m.values[name]))
	}
	wk := make([]waitKey, 0, len(m.waitValues))
	for k := range m.waitValues {
		wk = append(wk, k)
	}
	slices.SortFunc(wk, func(a, b waitKey) int {
		return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.session, b.session))
	})
	b = binary.AppendUvarint(b, uint64(len(wk)))
	for _, k := range wk {
		b = appendString(b, k.name)
		b = binary.AppendUvarint(b, k.session)
		b = appendString(b, string(m.waitValues[k]))
	}
	return &Snapshot{applied: m.applied, head: b, locks: m.locks.freeze(), nlocks: m.locks.len()}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Index returns the index of the last entry the snapshot reflects.
func (s *Snapshot) Index() uint64 { return s.applied }

// WriteTo writes the snapshot in the format above. It may run on any
// goroutine, once.
func (s *Snapshot) WriteTo(w io.Writer) (int64, error) {
	crc := crc32.New(crcTable)
	cw := &countWriter{w: io.MultiWriter(w, crc)}
	bw := bufio.NewWriterSize(cw, 1<<16)
	bw.Write(s.head)
	var scratch []byte
	scratch = binary.AppendUvarint(scratch[:0], uint64(s.nlocks))
	bw.Write(scratch)
	for _, shard := range s.locks {
		for name, l := range shard {
			scratch = appendString(scratch[:0], name)
			scratch = binary.AppendUvarint(scratch, l.holder)
			scratch = binary.AppendUvarint(scratch, l.token)
			if _, err := bw.Write(scratch); err != nil {
				return cw.n, err
			}
		}
	}
	if err := bw.Flush(); err != nil {
		return cw.n, err
	}
	n := cw.n
	var sum [4]byte
	binary.BigEndian.PutUint32(sum[:], crc.Sum32())
	m, err := w.Write(sum[:])
	return n + int64(m), err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Restore rebuilds a Machine from a snapshot written by Snapshot.WriteTo,
// with limits l (as New). It returns an error wrapping ErrCorrupt for data
// that fails its checksum or does not parse, and never panics.
func Restore(data []byte, l Limits) (*Machine, error) {
	if len(data) < len(snapshotMagic)+4 {
		return nil, fmt.Errorf("%w: snapshot of %d bytes is too short", ErrCorrupt, len(data))
	}
	body, sum := data[:len(data)-4], binary.BigEndian.Uint32(data[len(data)-4:])
	if crc32.Checksum(body, crcTable) != sum {
		return nil, fmt.Errorf("%w: snapshot checksum mismatch", ErrCorrupt)
	}
	magic := string(body[:len(snapshotMagic)])
	v1, v2 := magic == string(snapshotMagicV1), magic == string(snapshotMagicV2)
	if !v1 && !v2 && magic != string(snapshotMagic) {
		return nil, fmt.Errorf("%w: not a snapshot of format 1, 2 or 3", ErrCorrupt)
	}
	m := New(l)
	d := decoder{data: body, off: len(snapshotMagic)}
	m.applied = d.uvarint("applied")

	nsessions := d.count("sessions", 4)
	m.sessions = make(map[uint64]*session, nsessions)
	for range nsessions {
		id := d.uvarint("session id")
		s := &session{ttl: d.varint("ttl")}
		if !v1 && !v2 {
			s.openID = d.uvarint("open id")
		}
		s.done = d.uvarint("done")
		s.hi = s.done
		if !v1 {
			s.hi = d.uvarint("hi")
			s.holes = d.ids()
			if d.err == nil && (s.hi < s.done || !slices.IsSorted(s.holes) || len(slices.Compact(slices.Clone(s.holes))) != len(s.holes) ||
				(len(s.holes) > 0 && (s.holes[0] < s.done || s.holes[len(s.holes)-1] >= s.hi))) {
				d.fail("session %d: hi %d and holes %v do not fit done %d", id, s.hi, s.holes, s.done)
			}
		}
		for range d.count("outcomes", 4) {
			o := outcome{seq: d.uvarint("seq"), token: d.uvarint("token")}
			o.code = Code(d.byte("code"))
			o.name = d.name()
			s.outcomes = append(s.outcomes, o)
		}
		if d.err == nil {
			if _, dup := m.sessions[id]; dup || id == 0 || id > m.applied {
				// A session's ID is the index of the entry that opened it,
				// so it is at most the image's applied index.
				d.fail("duplicate, zero or future session %d (applied %d)", id, m.applied)
			}
			if _, dup := m.opens[s.openID]; dup && s.openID != 0 {
				d.fail("session %d: open ID %d of another session", id, s.openID)
			}
			m.sessions[id] = s
			m.order = append(m.order, sessionRef{id, s})
			if s.openID != 0 {
				m.opens[s.openID] = id
			}
		}
	}
	// Images list sessions by ID; keep order sorted whatever the input.
	slices.SortFunc(m.order, func(a, b sessionRef) int { return cmp.Compare(a.id, b.id) })
	for range d.count("queues", 2) {
		name := d.name()
		ids := d.ids()
		if d.err == nil && len(ids) > 0 {
			m.queues[name] = ids
		}
	}
	for range d.count("values", 2) {
		name, v := d.name(), d.value()
		if d.err == nil {
			m.values[name] = v
		}
	}
	for range d.count("waiting values", 3) {
		name, id, v := d.name(), d.uvarint("session"), d.value()
		if d.err == nil {
			m.waitValues[waitKey{name, id}] = v
		}
	}
	nlocks := d.count("locks", 3)
	m.locks = newLockTableSized(nlocks)
	for range nlocks {
		name := d.name()
		l := lock{holder: d.uvarint("holder"), token: d.uvarint("token")}
		if d.err == nil {
			m.locks.set(name, l)
		}
	}
	if d.err == nil && d.off != len(body) {
		d.fail("%d trailing bytes", len(body)-d.off)
	}
	if d.err != nil {
		return nil, d.err
	}
	// Rebuild each session's names and check the references.
	for name, l := range m.locks.all() {
		s, ok := m.sessions[l.holder]
		if !ok {
			return nil, fmt.Errorf("%w: lock %q held by unknown session %d", ErrCorrupt, name, l.holder)
		}
		s.names.add(name)
	}
	for name, q := range m.queues {
		if _, held := m.locks.lookup(name); !held {
			return nil, fmt.Errorf("%w: queue of free lock %q", ErrCorrupt, name)
		}
		for _, id := range q {
			s, ok := m.sessions[id]
			if !ok || s.names.has(name) {
				return nil, fmt.Errorf("%w: bad waiter %d of %q", ErrCorrupt, id, name)
			}
			s.names.add(name)
		}
	}
	return m, nil
}

// count reads a count of items each at least min bytes long, bounding it by
// the bytes left.
func (d *decoder) count(field string, min int) int {
	n := d.uvarint(field + " count")
	if d.err != nil {
		return 0
	}
	if left := len(d.data) - d.off; n > uint64(left/min) {
		d.fail("%s count %d exceeds the %d bytes left", field, n, left)
		return 0
	}
	return int(n)
}
