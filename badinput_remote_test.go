package quorumlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
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
