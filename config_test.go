package quorumlock_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

func TestStartRejectsBadConfig(t *testing.T) {
	base := func(dir string) quorumlock.Config {
		return quorumlock.Config{
			ID:      1,
			Peers:   map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1:2", 3: "127.0.0.1:3"},
			DataDir: dir,
		}
	}
	cases := []struct {
		name, field string
		mutate      func(*quorumlock.Config)
	}{
		{"zero ID", "ID", func(c *quorumlock.Config) { c.ID = 0 }},
		{"ID not a peer", "ID", func(c *quorumlock.Config) { c.ID = 9 }},
		{"no peers", "Peers", func(c *quorumlock.Config) { c.Peers = nil }},
		{"duplicate address", "Peers", func(c *quorumlock.Config) { c.Peers[3] = "127.0.0.1:2" }},
		{"bad address", "Peers", func(c *quorumlock.Config) { c.Peers[2] = "nowhere" }},
		{"no data dir", "DataDir", func(c *quorumlock.Config) { c.DataDir = "" }},
		{"TTL too short", "SessionTTL", func(c *quorumlock.Config) { c.SessionTTL = 500 * time.Millisecond }},
		{"TTL too long", "SessionTTL", func(c *quorumlock.Config) { c.SessionTTL = 11 * time.Minute }},
		{"negative TTL", "SessionTTL", func(c *quorumlock.Config) { c.SessionTTL = -time.Second }},
		{"election ticks", "ElectionTicks", func(c *quorumlock.Config) { c.ElectionTicks = 1 }},
		{"election vs TTL", "ElectionTicks", func(c *quorumlock.Config) { c.ElectionTicks = 100; c.SessionTTL = 2 * time.Second }},
		{"negative limit", "MaxWaitersPerLock", func(c *quorumlock.Config) { c.MaxWaitersPerLock = -1 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			cfg := base(dir)
			tc.mutate(&cfg)
			if cfg.DataDir == "" {
				dir = ""
			}
			n, err := quorumlock.Start(context.Background(), cfg)
			if err == nil {
				n.Close()
				t.Fatal("Start accepted the config")
			}
			if !errors.Is(err, quorumlock.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q: want ErrInvalidConfig naming %s", err, tc.field)
			}
			if dir != "" {
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Fatalf("a rejected config created its data directory (%v)", err)
				}
			}
		})
	}
}

func TestStartRefusesForeignDataDir(t *testing.T) {
	checkForeignDataDir(t, "")
}

// checkForeignDataDir checks that a data directory written by member 1 of
// cluster alpha with backend (the default if empty) is refused with
// ErrForeignDataDir to member 2 and to member 1 of another cluster, and
// reopens for its owner.
func checkForeignDataDir(t *testing.T, backend quorumlock.LogBackend) {
	t.Helper()
	dir := t.TempDir()
	start := func(id uint64, cluster string) (*quorumlock.Node, error) {
		lis := mustListen(t)
		peers := map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1:2", 3: "127.0.0.1:3"}
		peers[id] = lis.Addr().String()
		return quorumlock.Start(context.Background(), quorumlock.Config{
			ID: id, Peers: peers, DataDir: dir, Listener: lis, ClusterName: cluster, LogBackend: backend,
		})
	}
	n, err := start(1, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	for _, tc := range []struct {
		id      uint64
		cluster string
	}{{2, "alpha"}, {1, "beta"}} {
		if n, err := start(tc.id, tc.cluster); !errors.Is(err, quorumlock.ErrForeignDataDir) {
			if n != nil {
				n.Close()
			}
			t.Fatalf("member %d of %q on member 1 of alpha's directory (backend %q): %v, want ErrForeignDataDir", tc.id, tc.cluster, backend, err)
		}
	}
	n, err = start(1, "alpha")
	if err != nil {
		t.Fatalf("the rightful owner cannot restart: %v", err)
	}
	n.Close()
}

// Bad names and TTLs are rejected with sentinels before anything reaches
// the log, and change nothing. The check counts the leader's commits over
// a round of bad calls plus one valid acquire: exactly that acquire's entry
// may appear (a round in which the term moved is run again:
// sameTermWindow).
func TestBadInputChangesNothing(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	n := c.Node(follower(c, lead))
	s := newSession(t, n)
	l := mustAcquire(t, s, "good")
	ctx := testCtx(t, 30*time.Second)
	start, end := sameTermWindow(t, 5, func(round int) (quorumlock.Status, quorumlock.Status) {
		lead := c.WaitLeader(5 * time.Second)
		// The leader has committed everything n applied (the acquire of
		// "good" among it) once its published status shows it.
		applied := n.Status().Applied
		waitFor(t, "the leader's status to show what the follower applied", func() bool { return c.Node(lead).Status().Commit >= applied })
		start := c.Node(lead).Status()
		for _, name := range []string{"", strings.Repeat("x", 257), "bad\xffutf8", "nul\x00byte"} {
			checkLockCallsRefuseName(t, ctx, s, n, name)
		}
		for _, ttl := range []time.Duration{0, 999 * time.Millisecond, 10*time.Minute + time.Second} {
			if _, err := n.NewSession(ctx, quorumlock.WithTTL(ttl)); !errors.Is(err, quorumlock.ErrInvalidTTL) {
				t.Errorf("WithTTL(%v): %v", ttl, err)
			}
		}
		// A 256-byte name is valid: its acquire is the round's one entry.
		valid := strings.Repeat("y", 255) + strconv.Itoa(round)
		if _, err := s.Acquire(ctx, valid); err != nil {
			t.Fatalf("a 256-byte name is valid: %v", err)
		}
		// The leader publishes its status after the apply that answered
		// the acquire: wait for it to show that commit.
		waitFor(t, "the leader's status to show the acquire's commit", func() bool { return c.Node(lead).Status().Commit >= start.Commit+1 })
		return start, c.Node(lead).Status()
	})
	if end.Commit != start.Commit+1 {
		t.Errorf("bad input reached the log: commit %d -> %d, want %d (the valid acquire alone)", start.Commit, end.Commit, start.Commit+1)
	}
	if info := holder(t, n, "good"); info.Holder != s.ID() || info.Token != l.Token() {
		t.Errorf("lock changed: %+v", info)
	}
	if closed(s.Done()) {
		t.Error("session ended by bad input")
	}
}

func TestFence(t *testing.T) {
	f := quorumlock.NewFence()
	steps := []struct {
		res   string
		tok   quorumlock.Token
		stale bool
	}{{"c", 0, true}, {"a", 5, false}, {"a", 5, false}, {"a", 4, true}, {"b", 1, false}, {"a", 9, false}, {"a", 8, true}, {"a", 0, true}}
	for _, s := range steps {
		err := f.Admit(s.res, s.tok)
		if s.stale != errors.Is(err, quorumlock.ErrStaleToken) {
			t.Fatalf("Admit(%q, %d) = %v", s.res, s.tok, err)
		}
	}
	if f.Highest("a") != 9 || f.Highest("b") != 1 || f.Highest("c") != 0 {
		t.Fatal("Highest wrong")
	}
}

// Replicas configured with different table limits (a rolling change of a
// limit, one host's typo) still apply the log to the same table: the
// leader stamps its limits on every command it proposes (invariant 11).
// Replica 3 allows one lock per session; whichever replica leads, every
// replica must then agree on the holder of a session's second lock, before
// and after leadership moves.
func TestPerReplicaLimitsAgree(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 30 * time.Second,
		Configure: func(cfg *quorumlock.Config) {
			if cfg.ID == 3 {
				cfg.MaxLocksPerSession = 1
			}
		}})
	lead := c.WaitLeader(10 * time.Second)
	s := newSession(t, c.Node(lead))
	mustAcquire(t, s, "a")
	_, errB := s.TryAcquire(testCtx(t, 10*time.Second), "b")
	wantLimit := lead == 3
	if gotLimit := errors.Is(errB, quorumlock.ErrLimit); gotLimit != wantLimit || (errB != nil && !gotLimit) {
		t.Fatalf("leader %d: TryAcquire(b) by a session holding one lock: %v", lead, errB)
	}
	agree := func(when string) {
		t.Helper()
		var first quorumlock.LockInfo
		for i, id := range c.IDs() {
			info := holder(t, c.Node(id), "b")
			if i == 0 {
				first = info
			} else if info.Holder != first.Holder || info.Token != first.Token {
				t.Fatalf("%s: replica %d has b held by session %d (token %d), replica %d by %d (token %d)",
					when, c.IDs()[0], first.Holder, first.Token, id, info.Holder, info.Token)
			}
		}
	}
	agree("after the same log")
	c.Close(lead)
	c.Restart(lead)
	c.WaitLeader(10 * time.Second)
	agree("after a leader change")
}

// A replica that cannot take its address (in use) fails Start without
// touching its data directory: no log stamped with this cluster's identity
// is left behind to refuse a later, corrected configuration.
func TestStartListenErrorLeavesDataDirUntouched(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	dir := filepath.Join(t.TempDir(), "data")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := quorumlock.Start(ctx, quorumlock.Config{
		ID:      1,
		Peers:   map[uint64]string{1: busy.Addr().String(), 2: "127.0.0.1:2", 3: "127.0.0.1:3"},
		DataDir: dir,
	})
	if err == nil {
		n.Close()
		t.Fatal("Start on an address in use succeeded")
	}
	if !strings.Contains(err.Error(), "listen") {
		t.Errorf("Start: %v; want a listen error", err)
	}
	if _, serr := os.Stat(dir); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("after the failed Start the data directory exists (%v); want it untouched", serr)
	}
}
