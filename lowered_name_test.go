package quorumlock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
)

// A lock and a role granted under a larger MaxNameBytes stay readable after
// a rolling change lowered it: Holder, Leader and Observe, on a replica and
// through a Client, answer for a name over the limit while it is held, so
// an operator can still find (and revoke) the holder. A name over the
// limit that nobody holds, and one past MaxNameBytesLimit, are still
// refused with ErrInvalidName.
func TestLoweredNameLimitKeepsHeldLocksReadable(t *testing.T) {
	c, cl, lower := nameLimitCluster(t)
	ctx := testCtx(t, 60*time.Second)
	s := specSession(ctx, t, cl)
	long := strings.Repeat("n", 200)
	l, err := s.Acquire(ctx, long)
	if err != nil {
		t.Fatal(err)
	}
	ld, err := s.Elect(ctx, long, []byte("v"))
	if err != nil {
		t.Fatal(err)
	}

	lower(100)

	n := c.Node(c.IDs()[0])
	for _, r := range []struct {
		via  string
		read func() (quorumlock.LockInfo, error)
	}{
		{"Node", func() (quorumlock.LockInfo, error) { return n.Holder(ctx, long) }},
		{"Client", func() (quorumlock.LockInfo, error) { return cl.Holder(ctx, long) }},
	} {
		li, err := r.read()
		if err != nil || li.Holder != s.ID() || li.Token != l.Token() {
			t.Errorf("%s.Holder of a %d-byte held name under MaxNameBytes 100: %+v, %v; want session %d, token %d", r.via, len(long), li, err, s.ID(), l.Token())
		}
	}
	for _, r := range []struct {
		via  string
		read func() (quorumlock.LeaderInfo, error)
	}{
		{"Node", func() (quorumlock.LeaderInfo, error) { return n.Leader(ctx, long) }},
		{"Client", func() (quorumlock.LeaderInfo, error) { return cl.Leader(ctx, long) }},
	} {
		li, err := r.read()
		if err != nil || li.Session != s.ID() || li.Epoch != ld.Epoch() {
			t.Errorf("%s.Leader of a %d-byte role under MaxNameBytes 100: %+v, %v; want session %d, epoch %d", r.via, len(long), li, err, s.ID(), ld.Epoch())
		}
	}
	for via, ch := range map[string]<-chan quorumlock.LeaderInfo{"Node": n.Observe(ctx, long), "Client": cl.Observe(ctx, long)} {
		select {
		case li, ok := <-ch:
			if !ok || li.Session != s.ID() || li.Epoch != ld.Epoch() {
				t.Errorf("%s.Observe's first event: %+v (open %v); want session %d, epoch %d", via, li, ok, s.ID(), ld.Epoch())
			}
		case <-ctx.Done():
			t.Fatalf("%s.Observe: no event", via)
		}
	}

	free := strings.Repeat("f", 200)
	if _, err := n.Holder(ctx, free); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("Node.Holder of a free 200-byte name under MaxNameBytes 100: %v, want ErrInvalidName", err)
	}
	if _, err := cl.Holder(ctx, free); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("Client.Holder of a free 200-byte name under MaxNameBytes 100: %v, want ErrInvalidName", err)
	}
	for via, ch := range map[string]<-chan quorumlock.LeaderInfo{"Node": n.Observe(ctx, free), "Client": cl.Observe(ctx, free)} {
		select {
		case li, ok := <-ch:
			if ok {
				t.Errorf("%s.Observe of a free 200-byte role under MaxNameBytes 100 sent %+v; want the channel closed", via, li)
			}
		case <-ctx.Done():
			t.Fatalf("%s.Observe of a free over-limit role: not closed", via)
		}
	}
	if err := ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Leader(ctx, long); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("Node.Leader of the 200-byte role after Resign: %v, want ErrInvalidName", err)
	}
	if _, err := cl.Leader(ctx, long); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("Client.Leader of the 200-byte role after Resign: %v, want ErrInvalidName", err)
	}

	tooLong := strings.Repeat("n", quorumlock.MaxNameBytesLimit+1)
	if _, err := n.Holder(ctx, tooLong); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("Node.Holder of a name past MaxNameBytesLimit: %v, want ErrInvalidName", err)
	}
	if _, err := cl.Leader(ctx, tooLong); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("Client.Leader of a role past MaxNameBytesLimit: %v, want ErrInvalidName", err)
	}
}
