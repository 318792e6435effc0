// Review AA: edge configurations (smallest SnapshotEntries and limits),
// operator listings and odd numbers.

package quorumlock_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// SnapshotEntries 1, the smallest, on both log backends: a snapshot
// after every entry and a compacted log; a follower down meanwhile
// catches up from a snapshot, the whole cluster restarts, and tokens
// keep strictly increasing with the held lock intact.
func TestReviewAASnapshotEveryEntry(t *testing.T) {
	for _, be := range []quorumlock.LogBackend{quorumlock.LogPebble, quorumlock.LogWAL} {
		t.Run(string(be), func(t *testing.T) {
			c := testcluster.New(t, testcluster.Options{Size: 3, Configure: func(cfg *quorumlock.Config) {
				cfg.SnapshotEntries = 1
				cfg.LogBackend = be
			}})
			lead := c.WaitLeader(5 * time.Second)
			lagger := follower(c, lead)
			c.Stop(lagger)
			s := newSession(t, c.Node(lead), quorumlock.WithTTL(time.Minute))
			var last quorumlock.Token
			for i := range 30 {
				l := mustAcquire(t, s, fmt.Sprint("k", i%3))
				if l.Token() <= last {
					t.Fatalf("token %d after %d", l.Token(), last)
				}
				last = l.Token()
				if err := l.Release(testCtx(t, 5*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
			kept := mustAcquire(t, s, "kept")
			c.Restart(lagger)
			deadline := time.Now().Add(20 * time.Second)
			for c.Node(lagger).Status().Applied < c.Node(lead).Status().Commit {
				if time.Now().After(deadline) {
					t.Fatalf("lagging replica stuck at %d of %d", c.Node(lagger).Status().Applied, c.Node(lead).Status().Commit)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if info := holder(t, c.Node(lagger), "kept"); info.Holder != s.ID() || info.Token != kept.Token() {
				t.Fatalf("lagger: %+v", info)
			}
			c.StopAll()
			for _, id := range c.IDs() {
				c.Restart(id)
			}
			c.WaitLeader(10 * time.Second)
			if info := holder(t, c.Node(lagger), "kept"); info.Holder != s.ID() || info.Token != kept.Token() {
				t.Fatalf("after restart: %+v", info)
			}
			s2 := newSession(t, c.Node(c.Leader()), quorumlock.WithTTL(time.Minute))
			l := mustAcquire(t, s2, "k0")
			if l.Token() <= kept.Token() {
				t.Fatalf("token %d after restart not above %d", l.Token(), kept.Token())
			}
		})
	}
}

// Every limit at its smallest: MaxSessions (Node.Elect's dedicated
// session counts), MaxLocksPerSession 1 (a role counts), MaxWaitersPerLock
// 1 (TryAcquire of a full queue is still ErrLocked), MaxNameBytes 1 (in
// bytes: "é" is two). Refusals are ErrLimit or ErrInvalidName and end no
// session; the one waiter is granted with a larger token.
func TestReviewAALimitsOfOne(t *testing.T) {
	nodes := specCluster(t, 3, func(c *quorumlock.Config) {
		c.MaxSessions = 3
		c.MaxLocksPerSession = 1
		c.MaxWaitersPerLock = 1
		c.MaxNameBytes = 1
	})
	specLeader(t, nodes)
	cl := specDial(t, nodes)
	ctx := testCtx(t, 30*time.Second)
	a := specSession(ctx, t, nodes[0])
	b := specSession(ctx, t, cl)
	c := specSession(ctx, t, nodes[1])
	if _, err := cl.NewSession(ctx); !errors.Is(err, quorumlock.ErrLimit) {
		t.Errorf("4th session: %v", err)
	}
	if _, err := nodes[2].Elect(ctx, "r", nil); !errors.Is(err, quorumlock.ErrLimit) {
		t.Errorf("Node.Elect past MaxSessions: %v", err)
	}
	if _, err := a.Acquire(ctx, "ab"); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("2-byte name: %v", err)
	}
	if _, err := a.Acquire(ctx, "é"); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("2-byte rune name: %v", err)
	}
	la := mustAcquire(t, a, "x")
	if _, err := a.TryAcquire(ctx, "y"); !errors.Is(err, quorumlock.ErrLimit) {
		t.Errorf("2nd lock of a session: %v", err)
	}
	if _, err := a.Elect(ctx, "y", nil); !errors.Is(err, quorumlock.ErrLimit) {
		t.Errorf("role beyond MaxLocksPerSession: %v", err)
	}
	wb := acquireQueued(t, ctx, b, cl, "x")
	if _, err := c.Acquire(ctx, "x"); !errors.Is(err, quorumlock.ErrLimit) {
		t.Errorf("2nd waiter: %v", err)
	}
	if _, err := c.TryAcquire(ctx, "x"); !errors.Is(err, quorumlock.ErrLocked) {
		t.Errorf("TryAcquire with full queue: %v", err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-wb; r.err != nil || r.l.Token() <= la.Token() {
		t.Fatalf("b: %v", r.err)
	}
	if info := holder(t, cl, "x"); info.Holder != b.ID() {
		t.Fatalf("%+v", info)
	}
	if closed(a.Done()) || closed(c.Done()) {
		t.Fatal("limit refusals ended a session")
	}
}

// Client.Locks pages of one entry each visit every role and lock exactly
// once, roles first, with names at the edges of the key space (\x01,
// U+10FFFF, a role and a lock of the same name), waiters and values; a
// limit equal to what is left says no more follow. Client.Sessions
// counts a session's locks and roles in Held, and pages by ID.
func TestReviewAAPaging(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	specLeader(t, nodes)
	cl := specDial(t, nodes)
	ctx := testCtx(t, 30*time.Second)
	s := specSession(ctx, t, nodes[0])
	w := specSession(ctx, t, cl)
	names := []string{"\x01", "a", "a\x01", "a/b", "b", "\u00ff", "\U0010ffff"}
	roles := []string{"\x01", "a", "zz"}
	for _, n := range names {
		mustAcquire(t, s, n)
	}
	acquireQueued(t, ctx, w, cl, "a")
	for _, r := range roles {
		if _, err := s.Elect(ctx, r, []byte("v"+r)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	after := ""
	for i := 0; i < 100; i++ {
		page, more, err := cl.Locks(ctx, after, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page {
			got = append(got, fmt.Sprintf("%v:%q:%d:%v", e.Role, e.Name, len(e.Waiters), string(e.Value)))
			after = e.Cursor
		}
		if !more {
			break
		}
		if len(page) == 0 {
			t.Fatal("empty page with more")
		}
	}
	want := []string{"true:\"\\x01\":0:v\x01", "true:\"a\":0:va", "true:\"zz\":0:vzz",
		"false:\"\\x01\":0:", "false:\"a\":1:", "false:\"a\\x01\":0:", "false:\"a/b\":0:",
		"false:\"b\":0:", "false:\"ÿ\":0:", "false:\"\\U0010ffff\":0:"}
	if !slices.Equal(got, want) {
		t.Errorf("paged entries\n%q\nwant\n%q", got, want)
	}
	if len(got) != len(names)+len(roles) {
		t.Errorf("paged %d entries, want %d", len(got), len(names)+len(roles))
	}
	all, more, err := cl.Locks(ctx, "", len(names)+len(roles))
	if err != nil || more || len(all) != len(names)+len(roles) {
		t.Errorf("Locks with exact limit: %d entries more=%v err=%v", len(all), more, err)
	}
	ss, more, err := cl.Sessions(ctx, 0, 2)
	if err != nil || more || len(ss) != 2 {
		t.Errorf("Sessions exact: %+v more=%v %v", ss, more, err)
	}
	for _, e := range ss {
		if e.ID == s.ID() && e.Held != len(names)+len(roles) {
			t.Errorf("Held = %d, want %d", e.Held, len(names)+len(roles))
		}
	}
	ss, more, err = cl.Sessions(ctx, 0, 1)
	if err != nil || !more || len(ss) != 1 || ss[0].ID != min(s.ID(), w.ID()) {
		t.Errorf("Sessions limit 1: %+v more=%v %v", ss, more, err)
	}
}

// Odd numbers: Sessions after the largest ID is empty; RevokeSession of
// 0, the largest ID and an ID that opened no session is ErrSessionExpired;
// a nil value is published as empty and read the same through every
// opener; Leadership.Role and Session; session IDs and tokens are raft
// indexes (session < token <= commit); Client.Status has one entry per
// Dial address, in order, agreeing with the replicas.
func TestReviewAAOddNumbers(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	specLeader(t, nodes)
	cl := specDial(t, nodes)
	ctx := testCtx(t, 30*time.Second)
	if ss, more, err := cl.Sessions(ctx, ^uint64(0), 1); err != nil || more || len(ss) != 0 {
		t.Errorf("Sessions(max): %v %v %v", ss, more, err)
	}
	for _, id := range []uint64{0, ^uint64(0), 1} {
		if err := cl.RevokeSession(ctx, id); !errors.Is(err, quorumlock.ErrSessionExpired) {
			t.Errorf("RevokeSession(%d): %v", id, err)
		}
	}
	s := specSession(ctx, t, cl)
	ld, err := s.Elect(ctx, "nilval", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []opener{cl, nodes[0], nodes[1]} {
		info, err := o.Leader(ctx, "nilval")
		if err != nil || len(info.Value) != 0 || info.Epoch != ld.Epoch() || info.Session != s.ID() || info.Role != "nilval" {
			t.Errorf("%s: %+v %v", where(o), info, err)
		}
	}
	if err := ld.Proclaim(ctx, []byte{}); err != nil {
		t.Error(err)
	}
	if ld.Role() != "nilval" || ld.Session() != s {
		t.Errorf("Role/Session %q %p", ld.Role(), ld.Session())
	}
	// Session IDs and tokens are raft indexes: at most the commit index.
	l := mustAcquire(t, s, "idx")
	for _, n := range nodes {
		st := n.Status()
		if st.ID != n.ID() || st.Applied > st.Commit {
			t.Errorf("status %+v", st)
		}
	}
	lead := nodes[specLeader(t, nodes)]
	if st := lead.Status(); uint64(l.Token()) > st.Commit || s.ID() >= uint64(l.Token()) {
		t.Errorf("token %d session %d commit %d", l.Token(), s.ID(), st.Commit)
	}
	rs := cl.Status(ctx)
	for i, r := range rs {
		if r.Err != nil || r.Addr != specAddrs(nodes)[i] || r.ID != nodes[i].ID() || r.Leader != lead.ID() {
			t.Errorf("client status %d: %+v", i, r)
		}
	}
}

// MaxNameBytes at MaxNameBytesLimit (64 KiB): names and roles of exactly
// that many bytes (multi-byte runes) work through a follower and a
// Client, with a MaxValueBytes value, are listed (a page of Locks stays
// within its byte budget), survive snapshots and a restart of every
// replica on both log backends, and one byte more is ErrInvalidName.
func TestReviewAALongestNames(t *testing.T) {
	for _, be := range []quorumlock.LogBackend{quorumlock.LogPebble, quorumlock.LogWAL} {
		t.Run(string(be), func(t *testing.T) {
			c := testcluster.New(t, testcluster.Options{Size: 3, Configure: func(cfg *quorumlock.Config) {
				cfg.MaxNameBytes = quorumlock.MaxNameBytesLimit
				cfg.SnapshotEntries = 4
				cfg.LogBackend = be
			}})
			lead := c.WaitLeader(5 * time.Second)
			cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithSessionTTL(time.Minute))
			ctx := testCtx(t, 60*time.Second)
			long := func(r string, pad byte) string {
				n := quorumlock.MaxNameBytesLimit / len(r)
				return strings.Repeat(r, n) + strings.Repeat(string(pad), quorumlock.MaxNameBytesLimit-n*len(r))
			}
			s1 := newSession(t, c.Node(follower(c, lead)), quorumlock.WithTTL(time.Minute))
			s2 := newSession(t, cl)
			var locks []*quorumlock.Lock
			for i, s := range []*quorumlock.Session{s1, s2, s1, s2} {
				name := long([]string{"é", "𝄞", "a", "€"}[i], byte('a'+i))
				l, err := s.Acquire(ctx, name)
				if err != nil {
					t.Fatalf("Acquire of a %d-byte name: %v", len(name), err)
				}
				locks = append(locks, l)
			}
			if _, err := s1.Acquire(ctx, long("é", 'z')+"x"); !errors.Is(err, quorumlock.ErrInvalidName) {
				t.Errorf("a name of MaxNameBytesLimit+1 bytes: %v", err)
			}
			role := long("ü", 'r')
			ld, err := s2.Elect(ctx, role, make([]byte, quorumlock.MaxValueBytes))
			if err != nil {
				t.Fatal(err)
			}
			var listed int
			for after, more := "", true; more; {
				var page []quorumlock.LockEntry
				page, more, err = cl.Locks(ctx, after, 100)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range page {
					listed++
					after = e.Cursor
				}
			}
			if listed != len(locks)+1 {
				t.Errorf("listed %d entries, want %d", listed, len(locks)+1)
			}
			c.StopAll()
			for _, id := range c.IDs() {
				c.Restart(id)
			}
			lead = c.WaitLeader(10 * time.Second)
			for _, l := range locks {
				info := holder(t, c.Node(lead), l.Name())
				if info.Token != l.Token() || info.Name != l.Name() {
					t.Errorf("after restart: %d-byte name holder %d token %d, want token %d", len(l.Name()), info.Holder, info.Token, l.Token())
				}
			}
			if info, err := c.Node(lead).Leader(ctx, role); err != nil || info.Epoch != ld.Epoch() || len(info.Value) != quorumlock.MaxValueBytes {
				t.Errorf("role after restart: epoch %d value %d bytes, %v", info.Epoch, len(info.Value), err)
			}
		})
	}
}
