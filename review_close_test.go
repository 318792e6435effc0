package quorumlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// Client.Close with sessions, a waiting Acquire, an Observe and reads in
// flight leaves no goroutine of the client behind.
func TestReviewClientCloseLeavesNoGoroutines(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	holderSess := newSession(t, c.Node(lead))
	mustAcquire(t, holderSess, "busy")
	time.Sleep(100 * time.Millisecond)
	ignore := goleak.IgnoreCurrent()

	cl := dial(t, addrsOf(c, c.IDs()...))
	ctx := testCtx(t, 20*time.Second)
	var sessions []*quorumlock.Session
	for range 3 {
		s, err := cl.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, s)
	}
	if _, err := sessions[0].Acquire(ctx, "mine"); err != nil {
		t.Fatal(err)
	}
	if _, err := sessions[0].Elect(ctx, "role", nil); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() { _, err := sessions[1].Acquire(ctx, "busy"); waiting <- err }()
	obs := cl.Observe(ctx, "role")
	<-obs
	waitQueued(t, c.Node(lead), "busy", sessions[1].ID())
	reads := make(chan struct{})
	go func() {
		defer close(reads)
		for range 20 {
			cl.Holder(ctx, "busy")
		}
	}()
	time.Sleep(50 * time.Millisecond)
	cl.Close()
	select {
	case <-waiting:
	case <-time.After(5 * time.Second):
		t.Fatal("waiting Acquire not ended by Close")
	}
	<-reads
	for range obs {
	}
	for _, s := range sessions {
		if !closed(s.Done()) {
			t.Fatalf("session %d alive after Close", s.ID())
		}
	}
	goleak.VerifyNone(t, ignore)
}

// Probes that held up (they pass on the reviewed code); kept as regression
// tests for the remote client.

// A remote holder cut off from every replica sees Lost close before the
// cluster grants its lock to the next waiter (invariant 5 through Dial).
func TestReviewRemoteCutOffHolderLosesFirst(t *testing.T) {
	t.Parallel()
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 2 * time.Second})
	lead := c.WaitLeader(5 * time.Second)
	const clientID = 100
	cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithDialer(c.Net.Dialer(clientID)))
	ctx := testCtx(t, 20*time.Second)
	s, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	w := newSession(t, c.Node(lead))
	granted := make(chan time.Time, 1)
	go func() {
		if _, err := w.Acquire(ctx, "m"); err != nil {
			t.Error(err)
		}
		granted <- time.Now()
	}()
	waitQueued(t, c.Node(lead), "m", w.ID())
	for _, id := range c.IDs() {
		c.Net.Cut(clientID, id)
		c.Net.Cut(id, clientID)
	}
	var lostAt time.Time
	select {
	case <-l.Lost():
		lostAt = time.Now()
	case <-time.After(10 * time.Second):
		t.Fatal("cut-off remote holder never lost its lock")
	}
	at := <-granted
	if !lostAt.Before(at) {
		t.Fatalf("granted %v before the cut-off holder's Lost closed", lostAt.Sub(at))
	}
	if !errorsIsExpired(s.Err()) {
		t.Fatalf("session error %v", s.Err())
	}
	t.Logf("lost after cut: %v before grant", at.Sub(lostAt))
}

func errorsIsExpired(err error) bool { return errors.Is(err, quorumlock.ErrSessionExpired) }

// Leader(role) and Holder on a replica cut off from the majority never
// answer the stale state: they block until ctx ends, also after the
// majority changed the role's leader; through a client that only knows
// the cut-off replica as well.
func TestReviewCutOffReplicaReadsDoNotGoStale(t *testing.T) {
	t.Parallel()
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	f := follower(c, lead)
	a := newSession(t, c.Node(lead))
	la := mustElect(t, a, "sched", "a")
	ra := mustAcquire(t, a, "res")
	if li, err := c.Node(f).Leader(testCtx(t, 5*time.Second), "sched"); err != nil || li.Epoch != la.Epoch() {
		t.Fatalf("before the cut: %+v %v", li, err)
	}
	cl := dial(t, addrsOf(c, f))
	if _, err := cl.Leader(testCtx(t, 5*time.Second), "sched"); err != nil {
		t.Fatal(err)
	}
	c.Isolate(f)
	if err := la.Resign(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := ra.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	b := newSession(t, c.Node(lead))
	mustElect(t, b, "sched", "b")
	mustAcquire(t, b, "res")
	for name, read := range map[string]func(context.Context) (any, error){
		"node Leader":   func(ctx context.Context) (any, error) { return c.Node(f).Leader(ctx, "sched") },
		"node Holder":   func(ctx context.Context) (any, error) { return c.Node(f).Holder(ctx, "res") },
		"client Leader": func(ctx context.Context) (any, error) { return cl.Leader(ctx, "sched") },
		"client Holder": func(ctx context.Context) (any, error) { return cl.Holder(ctx, "res") },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		v, err := read(ctx)
		cancel()
		if err == nil {
			t.Errorf("%s on the cut-off replica answered %+v", name, v)
		}
	}
}

// Dial, and the calls of a client whose only replica accepts connections
// but never answers (a paused process), return within their contexts.
func TestReviewCallsBoundedAgainstSilentReplica(t *testing.T) {
	lis := silentListener(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := quorumlock.Dial(ctx, []string{lis.Addr().String()}, quorumlock.WithElectionTimeout(time.Second))
	if d := time.Since(start); err == nil || d > time.Second {
		t.Fatalf("Dial against a silent replica: %v after %v", err, d)
	}
}
