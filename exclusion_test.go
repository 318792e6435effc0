package quorumlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// Invariant 1 and 2: concurrent acquirers on every replica never overlap,
// and the fence sees strictly increasing tokens in grant order.
func TestMutualExclusionAcrossReplicas(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	c.WaitLeader(5 * time.Second)
	fence := quorumlock.NewFence()
	var holder atomic.Uint64 // session currently inside the critical section
	var mu sync.Mutex
	var tokens []quorumlock.Token
	var wg sync.WaitGroup
	const perReplica, rounds = 2, 15
	for _, id := range c.IDs() {
		for range perReplica {
			s := newSession(t, c.Node(id))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					l, err := s.Acquire(ctx, "shared")
					if err != nil {
						cancel()
						t.Errorf("acquire: %v", err)
						return
					}
					if !holder.CompareAndSwap(0, s.ID()) {
						t.Errorf("session %d granted while session %d holds the lock", s.ID(), holder.Load())
					}
					if err := fence.Admit("shared", l.Token()); err != nil {
						t.Errorf("fence: %v", err)
					}
					mu.Lock()
					tokens = append(tokens, l.Token())
					mu.Unlock()
					time.Sleep(time.Millisecond)
					holder.Store(0)
					if err := l.Release(ctx); err != nil {
						t.Errorf("release: %v", err)
					}
					cancel()
				}
			}()
		}
	}
	wg.Wait()
	if len(tokens) != len(c.IDs())*perReplica*rounds {
		t.Fatalf("got %d grants", len(tokens))
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("token %d at grant %d not above %d", tokens[i], i, tokens[i-1])
		}
	}
}

// Waiters are granted in the order they queued, each with a larger token.
func TestFIFOHandoff(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	h := newSession(t, c.Node(lead))
	hl := mustAcquire(t, h, "queue")

	type grant struct {
		idx   int
		token quorumlock.Token
		lock  *quorumlock.Lock
	}
	grants := make(chan grant, 8)
	var waiters []*quorumlock.Session
	for i := range 4 {
		id := c.IDs()[i%3]
		s := newSession(t, c.Node(id))
		waiters = append(waiters, s)
		go func() {
			l, err := s.Acquire(testCtx(t, 20*time.Second), "queue")
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			t.Logf("waiter %d session %d granted token %d", i, s.ID(), l.Token())
			grants <- grant{i, l.Token(), l}
		}()
		waitQueued(t, c.Node(lead), "queue", s.ID())
	}
	info := holder(t, c.Node(lead), "queue")
	if info.Holder != h.ID() || len(info.Waiters) != 4 {
		t.Fatalf("table before hand-off: %+v", info)
	}
	for i, s := range waiters {
		if info.Waiters[i] != s.ID() {
			t.Fatalf("waiter %d is session %d, want %d", i, info.Waiters[i], s.ID())
		}
	}
	if err := hl.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	last := hl.Token()
	for want := range 4 {
		g := <-grants
		if g.idx != want {
			t.Fatalf("grant %d went to waiter %d", want, g.idx)
		}
		if g.token <= last {
			t.Fatalf("token %d not above %d", g.token, last)
		}
		last = g.token
		if err := g.lock.Release(testCtx(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTryAcquireAndReentrantAcquire(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	a := newSession(t, c.Node(lead))
	b := newSession(t, c.Node(follower(c, lead)))
	la := mustAcquire(t, a, "k")
	if _, err := b.TryAcquire(testCtx(t, 5*time.Second), "k"); !errors.Is(err, quorumlock.ErrLocked) {
		t.Fatalf("TryAcquire of a held lock: %v, want ErrLocked", err)
	}
	if w := holder(t, c.Node(lead), "k").Waiters; len(w) != 0 {
		t.Fatalf("TryAcquire queued: %v", w)
	}
	again, err := a.TryAcquire(testCtx(t, 5*time.Second), "k")
	if err != nil || again.Token() != la.Token() {
		t.Fatalf("re-acquire by the holder: %v token %v, want the same grant %d", err, again, la.Token())
	}
	if err := la.Release(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := la.Release(testCtx(t, 5*time.Second)); !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Fatalf("second release: %v, want ErrNotHeld", err)
	}
	if !closed(la.Lost()) {
		t.Fatal("Lost not closed after release")
	}
	lb, err := b.TryAcquire(testCtx(t, 5*time.Second), "k")
	if err != nil || lb.Token() <= la.Token() {
		t.Fatalf("TryAcquire of a free lock: %v", err)
	}
}

// Session.Close releases every lock and grants the next waiters.
func TestCloseReleasesLocks(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	a := newSession(t, c.Node(follower(c, lead)))
	b := newSession(t, c.Node(lead))
	l1, l2 := mustAcquire(t, a, "x"), mustAcquire(t, a, "y")
	got := make(chan *quorumlock.Lock, 1)
	go func() {
		l, err := b.Acquire(testCtx(t, 10*time.Second), "y")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitQueued(t, c.Node(lead), "y", b.ID())
	if err := a.Close(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if !closed(a.Done()) || !closed(l1.Lost()) || !closed(l2.Lost()) {
		t.Fatal("Done/Lost not closed by Close")
	}
	if lb := <-got; lb == nil || lb.Token() <= l2.Token() {
		t.Fatalf("waiter not granted with a larger token: %v", lb)
	}
	if info := holder(t, c.Node(lead), "x"); info.Holder != 0 {
		t.Fatalf("x still held after Close: %+v", info)
	}
	if _, err := a.Acquire(testCtx(t, 5*time.Second), "z"); !errors.Is(err, quorumlock.ErrSessionExpired) {
		t.Fatalf("Acquire on a closed session: %v", err)
	}
}
