package quorumlock_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// Review S: NewSession sends one client-chosen open ID on every attempt,
// and the cluster answers a retry with the session an earlier attempt
// opened.

// An open that the leader logged and committed, whose answer was lost,
// and the leader then deposed: the client's retry reaches the new leader,
// which must answer with the session the first attempt opened, not open a
// second one. (Before, the second session was the caller's and the first
// stayed for its TTL, nobody's: the new leader could not tell it from a
// live one.) The lost answer, when it finally comes, must not end the
// session either.
func TestReviewSRetriedOpenAfterLeaderChangeGetsSameSession(t *testing.T) {
	const clientID = 100
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 20 * time.Second})
	lead := c.WaitLeader(10 * time.Second)
	ctx := testCtx(t, 40*time.Second)
	// Attempts time out after 1 s (twice the election timeout).
	cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithDialer(c.Net.Dialer(clientID)),
		quorumlock.WithElectionTimeout(500*time.Millisecond), quorumlock.WithSessionTTL(20*time.Second))
	var others []uint64
	for _, id := range c.IDs() {
		if id != lead {
			others = append(others, id)
		}
	}
	obs := dial(t, addrsOf(c, others...))

	// The client's connection to the leader is up (a cut link stalls its
	// handshake), and the cluster holds no session.
	warm, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if lead != c.WaitLeader(10*time.Second) {
		t.Skip("the leader changed")
	}
	// The leader's answers to the client are lost (held until Heal).
	c.Net.Cut(lead, clientID)
	type opened struct {
		s   *quorumlock.Session
		err error
	}
	got := make(chan opened, 1)
	go func() {
		s, err := cl.NewSession(ctx)
		got <- opened{s, err}
	}()
	var first []uint64
	for deadline := time.Now().Add(10 * time.Second); len(first) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the open was never committed")
		}
		first = listedSessions(t, ctx, obs)
	}
	if len(first) != 1 {
		t.Fatalf("sessions after one open: %v", first)
	}
	// A new leader among the others; the old one keeps the client's
	// requests and never answers them.
	c.Isolate(lead)
	var o opened
	select {
	case o = <-got:
	case <-ctx.Done():
		t.Fatal("NewSession did not return")
	}
	if o.err != nil {
		t.Fatalf("NewSession: %v", o.err)
	}
	if o.s.ID() != first[0] {
		t.Fatalf("the retry got session %d, the first attempt opened %d", o.s.ID(), first[0])
	}
	if listed := listedSessions(t, ctx, obs); !slices.Equal(listed, first) {
		t.Fatalf("the cluster holds %v, want only %v", listed, first)
	}
	// The lost answers arrive; the old leader rejoins.
	c.Heal()
	time.Sleep(2 * time.Second)
	if err := o.s.Err(); err != nil {
		t.Fatalf("the session ended: %v", err)
	}
	if listed := listedSessions(t, ctx, obs); !slices.Equal(listed, first) {
		t.Fatalf("after heal the cluster holds %v, want %v", listed, first)
	}
}

// Many NewSession calls while, in rounds, the leader's answers to the
// client come late (past the attempt limit, so the attempt is abandoned
// and sent again, and its answer arrives after): each call ends with one
// session, the same one every attempt of the call got, none of them is
// ended by the late answer of an earlier attempt, and the cluster holds
// exactly the sessions the callers received. Before, a late answer closed
// its session (propStream.abandonedOpens), which with open IDs is the
// session the retry received.
func TestReviewSOpensUnderLateAnswersOneSessionEach(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("fault rounds of several seconds")
	}
	const (
		clientID = 100
		openers  = 16
		rounds   = 5
	)
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: time.Minute})
	lead := c.WaitLeader(10 * time.Second)
	ctx := testCtx(t, 60*time.Second)
	cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithDialer(c.Net.Dialer(clientID)), quorumlock.WithSessionTTL(time.Minute))
	obs := dial(t, addrsOf(c, c.IDs()...))

	var mu sync.Mutex
	var received []*quorumlock.Session
	failed := 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range openers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				octx, cancel := context.WithTimeout(ctx, 20*time.Second)
				s, err := cl.NewSession(octx)
				cancel()
				mu.Lock()
				if err != nil {
					failed++
				} else {
					received = append(received, s)
				}
				mu.Unlock()
				time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
			}
		})
	}
	rnd := rand.New(rand.NewPCG(11, 11))
	for range rounds {
		lead = c.WaitLeader(10 * time.Second)
		// Past the client's attempt limit (200 ms) on some answers.
		c.Net.SetDelay(lead, clientID, time.Duration(150+rnd.IntN(150))*time.Millisecond)
		time.Sleep(time.Duration(400+rnd.IntN(300)) * time.Millisecond)
		c.Heal()
		time.Sleep(300 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if failed > 0 {
		t.Errorf("%d NewSession calls failed", failed)
	}
	if len(received) < 50 {
		t.Fatalf("only %d sessions opened: the attack did not run", len(received))
	}
	// Late answers still in flight land, abandoned sessions expire.
	var listed []uint64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		listed = listedSessions(t, ctx, obs)
		if len(listed) == len(received) || time.Now().After(deadline) {
			break
		}
	}
	want := make(map[uint64]bool)
	ended := 0
	for _, s := range received {
		if want[s.ID()] {
			t.Errorf("two calls received session %d", s.ID())
		}
		want[s.ID()] = true
		if err := s.Err(); err != nil {
			if ended++; ended <= 5 {
				t.Errorf("session %d ended under its caller: %v", s.ID(), err)
			}
		}
	}
	var unknown, missing []uint64
	for _, id := range listed {
		if !want[id] {
			unknown = append(unknown, id)
		}
		delete(want, id)
	}
	for id := range want {
		missing = append(missing, id)
	}
	t.Logf("%d sessions received, %d ended, the cluster holds %d (%d nobody received)", len(received), ended, len(listed), len(unknown))
	if len(missing) > 0 {
		t.Errorf("%d sessions received are gone from the cluster (their callers are told at their next heartbeat): %v", len(missing), missing[:min(10, len(missing))])
	}
	if len(unknown) > 0 {
		t.Errorf("the cluster holds %d sessions nobody received: %v", len(unknown), unknown[:min(10, len(unknown))])
	}
}
