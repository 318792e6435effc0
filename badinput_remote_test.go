package quorumlock_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// A Locks cursor that is not valid UTF-8 cannot go into the request (a
// protobuf string): the call must fail at once with ErrInvalidName, not
// retry the failed marshal against every replica until ctx ends.
func TestBadInputClientLocksCursorNotUTF8(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	id := c.WaitLeader(5 * time.Second)
	cl := dial(t, []string{c.Peers()[id]})
	s, err := cl.NewSession(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(testCtx(t, 10*time.Second), "a"); err != nil {
		t.Fatal(err)
	}
	for _, cur := range []string{"\xff", "a\xc3", "\x00\xff"} {
		ls, more, err := cl.Locks(testCtx(t, 10*time.Second), cur, 10)
		if !errors.Is(err, quorumlock.ErrInvalidName) || ls != nil || more {
			t.Errorf("Locks(%q) = %v, %v, %v; want ErrInvalidName", cur, ls, more, err)
		}
	}
	// The client still lists.
	ls, _, err := cl.Locks(testCtx(t, 10*time.Second), "", 10)
	if err != nil || len(ls) != 1 || ls[0].Name != "a" {
		t.Fatalf("Locks after the bad cursors: %v %v", ls, err)
	}
}

// A page of Locks must fit in a gRPC message the client accepts (4 MiB by
// default), whatever limit asked for: 1,100 locks with 4 KiB values were
// sent as one 4.5 MiB page that the client refused, and Client.Locks
// retried that page until ctx ended. The replica now ends a page early
// (more = true) and the pages together list every lock once.
func TestBadInputClientLocksPageFitsMessage(t *testing.T) {
	t.Parallel()
	c := testcluster.New(t, testcluster.Options{Size: 1})
	id := c.WaitLeader(5 * time.Second)
	raw := dialLeader(t, c.Node(id))
	ctx := testCtx(t, 60*time.Second)
	r, err := raw.Propose(ctx, &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: 600_000})
	if err != nil || r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("open: %v %v", r, err)
	}
	const n = 1100
	val := make([]byte, 4096) // the largest value a grant may carry
	for i := range n {
		seq := uint64(i + 1)
		r, err := raw.Propose(ctx, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: r.GetSession(), Seq: seq, Done: seq, Name: fmt.Sprintf("k%05d", i), Value: val})
		if err != nil || r.GetCode() != lockpb.Code_CODE_OK {
			t.Fatalf("acquire %d: %v %v", i, r, err)
		}
	}
	cl := dial(t, []string{c.Peers()[id]})
	seen := 0
	for after, pages := "", 0; ; pages++ {
		if pages > n {
			t.Fatal("paging does not advance")
		}
		page, more, err := cl.Locks(testCtx(t, 10*time.Second), after, 10_000)
		if err != nil {
			t.Fatalf("Locks after %q: %v", after, err)
		}
		for _, l := range page {
			if want := fmt.Sprintf("k%05d", seen); l.Name != want || len(l.Value) != len(val) {
				t.Fatalf("entry %d: %q with %d value bytes, want %q", seen, l.Name, len(l.Value), want)
			}
			seen++
		}
		if !more {
			break
		}
		if len(page) == 0 {
			t.Fatal("empty page with more")
		}
		after = page[len(page)-1].Cursor
	}
	if seen != n {
		t.Fatalf("listed %d locks, want %d", seen, n)
	}
}
