package fsm

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkApplyAcquireRelease measures one uncontended acquire plus its
// release (two entries), the hot path of every replica.
func BenchmarkApplyAcquireRelease(b *testing.B) {
	m := New(Limits{})
	m.Apply(1, 1, &Command{Op: OpOpenSession, TTL: 10e9})
	index, seq := uint64(1), uint64(0)
	acq := Command{Op: OpAcquire, Session: 1, Name: "orders/42"}
	rel := Command{Op: OpRelease, Session: 1, Name: "orders/42"}
	b.ReportAllocs()
	for b.Loop() {
		index++
		seq++
		acq.Seq, acq.Done = seq, seq
		res, _ := m.Apply(index, 1, &acq)
		index++
		seq++
		rel.Seq, rel.Done, rel.Token = seq, seq, res.Token
		if res, _ := m.Apply(index, 1, &rel); res.Code != CodeOK {
			b.Fatalf("release: %+v", res)
		}
	}
}

// BenchmarkApplyHandOff measures a release that grants the lock to the next
// of 16 waiters, plus the acquire by which the releasing session queues
// again.
func BenchmarkApplyHandOff(b *testing.B) {
	m := New(Limits{})
	const sessions = 17
	index := uint64(0)
	var seqs [sessions + 1]uint64
	for range sessions {
		index++
		m.Apply(index, 1, &Command{Op: OpOpenSession, TTL: 10e9})
	}
	for id := uint64(1); id <= sessions; id++ {
		index++
		seqs[id]++
		m.Apply(index, 1, &Command{Op: OpAcquire, Session: id, Seq: seqs[id], Done: seqs[id], Name: "hot"})
	}
	holder, token := uint64(1), uint64(sessions+1)
	rel := Command{Op: OpRelease, Name: "hot"}
	acq := Command{Op: OpAcquire, Name: "hot"}
	b.ReportAllocs()
	for b.Loop() {
		index++
		seqs[holder]++
		rel.Session, rel.Seq, rel.Done, rel.Token = holder, seqs[holder], seqs[holder], token
		_, ev := m.Apply(index, 1, &rel)
		if len(ev) != 1 {
			b.Fatalf("release: %v", ev)
		}
		index++
		seqs[holder]++
		acq.Session, acq.Seq, acq.Done = holder, seqs[holder], seqs[holder]
		m.Apply(index, 1, &acq)
		holder, token = ev[0].Session, ev[0].Token
	}
}

// BenchmarkEncodeDecode measures the round trip of an acquire through the
// log encoding.
func BenchmarkEncodeDecode(b *testing.B) {
	cmd := Command{Op: OpAcquire, Session: 123456, Seq: 789, Done: 788, Name: "orders/42"}
	buf := make([]byte, 0, 64)
	var out Command
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendEncode(buf[:0], &cmd)
		if err := Decode(buf, &out); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHeldLockMemory reports the Go heap per held lock with 1,000,000
// locks held by 100,000 sessions (10 each), the sizing goal of DESIGN.md
// (<= 150 B). Run it with -benchtime=1x.
func BenchmarkHeldLockMemory(b *testing.B) {
	const sessions, perSession = 100_000, 10
	for b.Loop() {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		m := New(Limits{})
		index := uint64(0)
		for range sessions {
			index++
			m.Apply(index, 1, &Command{Op: OpOpenSession, TTL: 10e9})
		}
		var cmd Command
		for s := uint64(1); s <= sessions; s++ {
			for i := range uint64(perSession) {
				index++
				// Each name decoded from its own entry, as on a replica.
				data := Encode(&Command{Op: OpAcquire, Session: s, Seq: i + 1, Done: i + 1, Name: fmt.Sprintf("lock-%d-%d", s, i)})
				if err := Decode(data, &cmd); err != nil {
					b.Fatal(err)
				}
				if res, _ := m.Apply(index, 1, &cmd); res.Code != CodeOK {
					b.Fatalf("acquire: %+v", res)
				}
			}
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		locks := m.NumLocks()
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(locks), "heap-B/lock")
		runtime.KeepAlive(m)
	}
}

// BenchmarkExpire100kSessions measures the apply of one OpExpire that ends
// 100,000 sessions holding 10 locks each, half of them with a waiter from a
// surviving session (DESIGN.md: all released within 2 s). Run it with
// -benchtime=1x.
func BenchmarkExpire100kSessions(b *testing.B) {
	const sessions, perSession = 100_000, 10
	for b.Loop() {
		b.StopTimer()
		m := New(Limits{MaxLocksPerSession: sessions * perSession})
		index := uint64(0)
		ids := make([]uint64, 0, sessions)
		for range sessions {
			index++
			m.Apply(index, 1, &Command{Op: OpOpenSession, TTL: 10e9})
			ids = append(ids, index)
		}
		index++
		m.Apply(index, 1, &Command{Op: OpOpenSession, TTL: 10e9})
		survivor := index
		seq := uint64(0)
		for _, s := range ids {
			for i := range uint64(perSession) {
				name := fmt.Sprintf("lock-%d-%d", s, i)
				index++
				m.Apply(index, 1, &Command{Op: OpAcquire, Session: s, Seq: i + 1, Done: i + 1, Name: name})
				if s%2 == 0 {
					index++
					seq++
					m.Apply(index, 1, &Command{Op: OpAcquire, Session: survivor, Seq: seq, Done: seq, Name: name})
				}
			}
		}
		b.StartTimer()
		index++
		res, ev := m.Apply(index, 1, &Command{Op: OpExpire, Term: 1, IDs: ids})
		if res.Code != CodeOK || m.NumSessions() != 1 || len(ev) != sessions+sessions/2*perSession {
			b.Fatalf("expire: %+v, %d events, %d sessions left", res, len(ev), m.NumSessions())
		}
	}
}

// BenchmarkSnapshot1M measures a snapshot of 1,000,000 locks over 100,000
// sessions: the pause on the apply goroutine (Snapshot), the time to write
// it (WriteTo, off the apply goroutine), the longest single apply while the
// write runs (copy-on-write of a frozen shard), its size, and Restore.
// Run it with -benchtime=1x.
func BenchmarkSnapshot1M(b *testing.B) {
	const sessions, perSession = 100_000, 10
	m := New(Limits{})
	index := uint64(0)
	for range sessions {
		index++
		m.Apply(index, 1, &Command{Op: OpOpenSession, TTL: 10e9})
	}
	for s := uint64(1); s <= sessions; s++ {
		for i := range uint64(perSession) {
			index++
			m.Apply(index, 1, &Command{Op: OpAcquire, Session: s, Seq: i + 1, Done: i + 1, Name: fmt.Sprintf("lock-%d-%d", s, i)})
		}
	}
	for b.Loop() {
		want := m.NumLocks() // each pass adds extra-* locks after its snapshot
		start := time.Now()
		snap := m.Snapshot()
		pause := time.Since(start)

		// Apply keeps going while the snapshot is written.
		done := make(chan struct{})
		var worst time.Duration
		var applies int
		go func() {
			defer close(done)
			seq := uint64(perSession + 1)
			for s := uint64(1); s <= sessions; s += 97 {
				index++
				t := time.Now()
				m.Apply(index, 1, &Command{Op: OpAcquire, Session: s, Seq: seq, Done: seq, Name: fmt.Sprintf("extra-%d", s)})
				worst = max(worst, time.Since(t))
				applies++
			}
		}()
		var buf bytes.Buffer
		start = time.Now()
		if _, err := snap.WriteTo(&buf); err != nil {
			b.Fatal(err)
		}
		write := time.Since(start)
		<-done
		start = time.Now()
		r, err := Restore(buf.Bytes(), Limits{})
		if err != nil {
			b.Fatal(err)
		}
		restore := time.Since(start)
		if r.NumLocks() != want {
			b.Fatalf("restored %d locks", r.NumLocks())
		}
		b.ReportMetric(float64(pause.Microseconds())/1000, "pause-ms")
		b.ReportMetric(float64(write.Milliseconds()), "write-ms")
		b.ReportMetric(float64(worst.Microseconds())/1000, "max-apply-ms")
		b.ReportMetric(float64(buf.Len())/(1<<20), "MiB")
		b.ReportMetric(float64(restore.Milliseconds()), "restore-ms")
		_ = applies
	}
}
