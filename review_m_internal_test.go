package quorumlock

import (
	"sync"
	"testing"
	"time"
)

// The per-address away channels (Client.away): learning leader X ends
// what waits at every other address and nothing that waits at X (also
// when X was forgotten by rotate and learned again); a closed channel is
// dropped, and the next pick of that address gets a new, open one;
// rewatch tells a stream whether its address is still the one to try.
func TestReviewMAwayChannelsSemantics(t *testing.T) {
	c := &Client{addrs: []string{"a", "b", "c"}}

	addr, chA := c.pickWatch()
	if addr != "a" {
		t.Fatalf("pick %q, want a", addr)
	}
	c.setLeader("a")
	if isDone(chA) {
		t.Fatal("learning the address an attempt waits at ended it")
	}
	if addr, ch := c.pickWatch(); addr != "a" || ch != chA {
		t.Fatalf("pick %q (same channel %v), want a with its channel", addr, ch == chA)
	}

	c.rotate("a") // a call's timeout at a: forgotten
	addr, chB := c.pickWatch()
	if addr != "b" {
		t.Fatalf("after rotate, pick %q, want b", addr)
	}
	c.setLeader("a") // learned again
	if !isDone(chB) {
		t.Fatal("the attempt at b did not move when a was learned again")
	}
	if isDone(chA) {
		t.Fatal("the attempts at a ended when a was learned again")
	}
	if _, still := c.rewatch("b"); still {
		t.Fatal("rewatch(b) with leader a: still")
	}
	if ch, still := c.rewatch("a"); !still || ch != chA {
		t.Fatalf("rewatch(a) with leader a: still %v, same channel %v", still, ch == chA)
	}

	c.setLeader("c")
	if !isDone(chA) {
		t.Fatal("the attempt at a did not move when c was learned")
	}
	addr, chC := c.pickWatch()
	c.setLeader("a")
	if addr != "c" || !isDone(chC) {
		t.Fatalf("pick %q; the attempt at c moved when a was learned: %v", addr, isDone(chC))
	}
	addr, chA2 := c.pickWatch()
	if addr != "a" || chA2 == chA || isDone(chA2) {
		t.Fatalf("pick %q: a new open channel for a: new %v, open %v", addr, chA2 != chA, !isDone(chA2))
	}
	if len(c.away) > len(c.addrs) {
		t.Fatalf("%d away channels for %d addresses", len(c.away), len(c.addrs))
	}
}

// Concurrent picks, rewatches, leader changes and rotations (run with
// -race): no channel is closed twice (a panic), none is left open
// forever (replaced without being closed: an attempt at that address
// would never move again), and the map stays bounded by the addresses.
func TestReviewMAwayChannelsConcurrent(t *testing.T) {
	addrs := []string{"a", "b", "c", "d"}
	c := &Client{addrs: addrs}
	deadline := time.Now().Add(300 * time.Millisecond)
	var (
		mu   sync.Mutex
		seen = make(map[<-chan struct{}]string)
		wg   sync.WaitGroup
	)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				addr, ch := c.pickWatch()
				if ch2, still := c.rewatch(addr); still {
					mu.Lock()
					seen[ch2] = addr
					mu.Unlock()
				}
				mu.Lock()
				seen[ch] = addr
				mu.Unlock()
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				a := addrs[(i+w)%len(addrs)]
				if i%3 == 0 {
					c.rotate(a)
				} else {
					c.setLeader(a)
				}
			}
		}()
	}
	wg.Wait()
	if n := len(c.away); n > len(addrs) {
		t.Fatalf("%d away channels for %d addresses", n, len(addrs))
	}
	// Learning a then b ends whatever waits anywhere but at b, where
	// only b's current channel is open.
	c.setLeader("a")
	c.setLeader("b")
	open := 0
	for ch, addr := range seen {
		if !isDone(ch) && ch != c.away["b"] {
			open++
			if open < 5 {
				t.Errorf("a channel of %s is still open after a and b were learned", addr)
			}
		}
	}
	if open > 0 {
		t.Fatalf("%d of %d channels never closed", open, len(seen))
	}
}
