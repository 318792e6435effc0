package fsm

import (
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestDataDriven runs the scripts in testdata/. Each script drives one
// Machine through a small command language:
//
//	new [max-name-bytes=N] [max-sessions=N] [max-locks-per-session=N]
//	    [max-waiters-per-lock=N] [max-pending=N] [min-ttl=D] [max-ttl=D]
//	                               start over with a fresh Machine
//	open ttl=D [nonce=N] [open-id=N]
//	acquire session=N seq=N [done=N] name=S [try]
//	release session=N seq=N [done=N] name=S token=N
//	withdraw session=N seq=N [done=N] name=S [target=N]
//	close session=N seq=N [done=N]
//	expire ids=(N,...) [term=N]     Command.Term; defaults to the entry term
//	raw hex=H                       apply undecodable or hand-made bytes
//	noop                            SetApplied
//	holder name=S
//	sessions
//	session-locks id=N
//	state                           every table, dedupe outcomes included
//
// Every command that applies an entry also takes [index=N] (default:
// Applied()+1) and [entry-term=N] (default 1), and prints its result, then
// its events. A name is either plain (name=a), Go-quoted (name="a\x00"), or
// generated (name-len=N: N bytes of 'x'). Commands go through Encode and
// ApplyEntry, and the test checks that the decoded command is the one
// encoded and that the machine's invariants hold after each entry.
func TestDataDriven(t *testing.T) {
	// Only *.txt: rapid keeps its failure files under testdata/rapid.
	paths, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no scripts in testdata: %v", err)
	}
	for _, path := range paths {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			runScript(t, path)
		})
	}
}

func runScript(t *testing.T, path string) {
	m := New(Limits{})
	datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
		switch d.Cmd {
		case "new":
			m = New(scanLimits(t, d))
			return ""
		case "holder":
			return formatLock(m.Holder(scanName(t, d)))
		case "locks":
			var after string
			limit := 100
			d.MaybeScanArgs(t, "after", &after)
			d.MaybeScanArgs(t, "limit", &limit)
			page, more := m.Locks(after, limit)
			var b strings.Builder
			for _, li := range page {
				fmt.Fprintf(&b, "%s held=%d\n", formatLock(li), m.Held(li.Holder))
			}
			fmt.Fprintf(&b, "more=%v\n", more)
			return b.String()
		case "sessions":
			var b strings.Builder
			for _, s := range m.Sessions() {
				fmt.Fprintf(&b, "session %d ttl=%s\n", s.ID, time.Duration(s.TTL))
			}
			fmt.Fprintf(&b, "sessions=%d locks=%d applied=%d", m.NumSessions(), m.NumLocks(), m.Applied())
			return b.String()
		case "session-locks":
			var id uint64
			d.ScanArgs(t, "id", &id)
			var b strings.Builder
			for _, li := range m.SessionLocks(id) {
				fmt.Fprintln(&b, formatLock(li))
			}
			return b.String()
		case "state":
			return dump(m)
		case "noop":
			m.SetApplied(scanIndex(t, d, m))
			return fmt.Sprintf("applied=%d", m.Applied())
		}

		index := scanIndex(t, d, m)
		entryTerm := uint64(1)
		d.MaybeScanArgs(t, "entry-term", &entryTerm)
		var data []byte
		cmd, ok := scanCommand(t, d, entryTerm)
		if ok {
			data = Encode(&cmd)
		} else if d.Cmd == "raw" {
			var h string
			d.ScanArgs(t, "hex", &h)
			var err error
			if data, err = hex.DecodeString(h); err != nil {
				d.Fatalf(t, "hex: %v", err)
			}
		} else {
			d.Fatalf(t, "unknown command %q", d.Cmd)
		}
		got, res, events := m.ApplyEntry(index, entryTerm, data)
		if ok && !equalCommand(got, cmd) {
			t.Errorf("decoded %+v, encoded %+v", got, cmd)
		}
		if err := checkInvariants(m); err != nil {
			t.Errorf("after index %d: %v", index, err)
		}
		var b strings.Builder
		b.WriteString(formatResult(res))
		for _, e := range events {
			b.WriteString("\n")
			b.WriteString(formatEvent(e))
		}
		return b.String()
	})
}

func scanLimits(t *testing.T, d *datadriven.TestData) Limits {
	var l Limits
	d.MaybeScanArgs(t, "max-name-bytes", &l.MaxNameBytes)
	d.MaybeScanArgs(t, "max-sessions", &l.MaxSessions)
	d.MaybeScanArgs(t, "max-locks-per-session", &l.MaxLocksPerSession)
	d.MaybeScanArgs(t, "max-waiters-per-lock", &l.MaxWaitersPerLock)
	d.MaybeScanArgs(t, "max-pending", &l.MaxPendingPerSession)
	l.MinTTL = int64(scanDuration(t, d, "min-ttl"))
	l.MaxTTL = int64(scanDuration(t, d, "max-ttl"))
	return l
}

func scanDuration(t *testing.T, d *datadriven.TestData, key string) time.Duration {
	var s string
	if !d.MaybeScanArgs(t, key, &s) {
		return 0
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "%s: %v", key, err)
	}
	return v
}

func scanIndex(t *testing.T, d *datadriven.TestData, m *Machine) uint64 {
	index := m.Applied() + 1
	d.MaybeScanArgs(t, "index", &index)
	return index
}

func scanName(t *testing.T, d *datadriven.TestData) string {
	var n int
	if d.MaybeScanArgs(t, "name-len", &n) {
		return strings.Repeat("x", n)
	}
	arg, ok := d.Arg("name")
	if !ok {
		d.Fatalf(t, "missing name")
	}
	name := arg.SingleVal(t)
	if role, ok := strings.CutPrefix(name, "role:"); ok {
		return RolePrefix + role
	}
	if strings.HasPrefix(name, `"`) {
		var err error
		if name, err = strconv.Unquote(name); err != nil {
			d.Fatalf(t, "name %s: %v", arg.SingleVal(t), err)
		}
	}
	return name
}

// scanValue reads value=S (a role's value); none or value=() is nil.
func scanValue(t *testing.T, d *datadriven.TestData) []byte {
	var v string
	if d.MaybeScanArgs(t, "value", &v) && v != "" {
		return []byte(v)
	}
	return nil
}

// scanCommand parses the commands that become log entries; ok is false for
// any other.
func scanCommand(t *testing.T, d *datadriven.TestData, entryTerm uint64) (cmd Command, ok bool) {
	sessionSeq := func() {
		d.ScanArgs(t, "session", &cmd.Session)
		d.ScanArgs(t, "seq", &cmd.Seq)
		d.MaybeScanArgs(t, "done", &cmd.Done)
		// pending=(a,b) lists the session's other requests in flight;
		// listed alone lists none.
		cmd.Listed = d.HasArg("listed")
		if arg, ok := d.Arg("pending"); ok {
			cmd.Listed = true
			for i := range arg.Vals {
				if arg.Vals[i] == "" {
					continue
				}
				var p uint64
				arg.Scan(t, i, &p)
				cmd.Pending = append(cmd.Pending, p)
			}
		}
	}
	switch d.Cmd {
	case "open":
		cmd.Op = OpOpenSession
		cmd.TTL = int64(scanDuration(t, d, "ttl"))
		d.MaybeScanArgs(t, "nonce", &cmd.Nonce)
		d.MaybeScanArgs(t, "open-id", &cmd.OpenID)
	case "acquire":
		cmd.Op = OpAcquire
		sessionSeq()
		cmd.Name = scanName(t, d)
		cmd.Try = d.HasArg("try")
		cmd.Value = scanValue(t, d)
	case "proclaim":
		cmd.Op = OpProclaim
		sessionSeq()
		cmd.Name = scanName(t, d)
		d.ScanArgs(t, "token", &cmd.Token)
		cmd.Value = scanValue(t, d)
	case "release":
		cmd.Op = OpRelease
		sessionSeq()
		cmd.Name = scanName(t, d)
		d.ScanArgs(t, "token", &cmd.Token)
	case "withdraw":
		cmd.Op = OpWithdraw
		sessionSeq()
		cmd.Name = scanName(t, d)
		d.MaybeScanArgs(t, "target", &cmd.Target)
	case "close":
		cmd.Op = OpCloseSession
		sessionSeq()
	case "expire", "revoke":
		cmd.Op = OpExpire
		cmd.Term = entryTerm
		if d.Cmd == "revoke" {
			cmd.Op, cmd.Term = OpRevoke, 0
		}
		d.MaybeScanArgs(t, "term", &cmd.Term)
		if arg, ok := d.Arg("ids"); ok {
			for i := range arg.Vals {
				if arg.Vals[i] == "" {
					continue // ids=()
				}
				var id uint64
				arg.Scan(t, i, &id)
				cmd.IDs = append(cmd.IDs, id)
			}
		}
	default:
		return Command{}, false
	}
	return cmd, true
}
