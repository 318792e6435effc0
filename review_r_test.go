package quorumlock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// reviewROpened is a session a caller received, and what became of it.
type reviewROpened struct {
	s        *quorumlock.Session
	where    string
	got      time.Time // when NewSession returned it
	endedAt  time.Time // when Done was seen closed (zero: still alive)
	deadline time.Time // Deadline() once Done closed
	err      error
}

// TestReviewROpensUnderLostAnswersKeepReceivedSessions attacks the expiry
// of abandoned opens (service.abandonedOpens, propStream.closeOpenedLocked)
// under faults: many callers open sessions on a remote client and on the
// followers' Nodes while, in rounds, the leader is cut off from the other
// replicas (its proposals never commit, the opens sent to it are abandoned
// and sent again), the answers of the leader to the client and to the
// followers are delayed past the attempt limit (so they come after the
// caller gave up on them), and links drop connections (answers lost). No
// session a caller received may be ended by the cluster while its lease
// holds (an abandoned-open expiry of the wrong session would), and once
// the faults stop and a TTL has passed, the cluster holds exactly the
// sessions the callers received: the abandoned ones are gone.
func TestReviewROpensUnderLostAnswersKeepReceivedSessions(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("fault rounds of several seconds")
	}
	const (
		ttl     = 3 * time.Second
		clients = 100 // network ID of the remote client
		openers = 24
		rounds  = 6
	)
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: ttl})
	lead := c.WaitLeader(10 * time.Second)
	cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithDialer(c.Net.Dialer(clients)), quorumlock.WithSessionTTL(ttl))
	ctx := testCtx(t, 60*time.Second)

	var mu sync.Mutex
	var opened []*reviewROpened
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range openers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				var (
					s     *quorumlock.Session
					err   error
					where string
				)
				octx, cancel := context.WithTimeout(ctx, 2*time.Second)
				if i%3 == 0 {
					// A follower's Node, forwarding to the leader.
					id := c.IDs()[i%len(c.IDs())]
					n := c.Node(id)
					if n == nil {
						cancel()
						continue
					}
					where = "node"
					s, err = n.NewSession(octx)
				} else {
					where = "client"
					s, err = cl.NewSession(octx)
				}
				cancel()
				if err != nil {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				o := &reviewROpened{s: s, where: where, got: time.Now()}
				mu.Lock()
				opened = append(opened, o)
				mu.Unlock()
				go func() {
					<-s.Done()
					mu.Lock()
					o.endedAt, o.deadline, o.err = time.Now(), s.Deadline(), s.Err()
					mu.Unlock()
				}()
				time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
			}
		})
	}

	rnd := rand.New(rand.NewPCG(7, 7))
	ids := c.IDs()
	for r := range rounds {
		lead = c.WaitLeader(10 * time.Second)
		switch r % 3 {
		case 0:
			// The leader cut off from the replicas; the client reaches
			// every replica.
			c.Isolate(lead)
		case 1:
			// Answers of the leader late: past the client's attempt
			// limit (200 ms) and the router's.
			for _, id := range append(ids, clients) {
				if id != lead {
					c.Net.SetDelay(lead, id, time.Duration(150+rnd.IntN(200))*time.Millisecond)
				}
			}
		case 2:
			// Connections broken under the answers.
			for _, id := range ids {
				c.Net.SetDrop(id, clients, 0.2)
				if id != lead {
					c.Net.SetDrop(lead, id, 0.1)
				}
			}
		}
		time.Sleep(time.Duration(400+rnd.IntN(300)) * time.Millisecond)
		c.Heal()
		time.Sleep(300 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	c.WaitLeader(10 * time.Second)

	// Past a TTL after the faults: every abandoned or lost open is
	// expired, every received session still alive kept by heartbeats.
	time.Sleep(ttl + ttl/2)
	mu.Lock()
	defer mu.Unlock()
	live := make(map[uint64]bool)
	early := 0
	for _, o := range opened {
		if o.endedAt.IsZero() {
			live[o.s.ID()] = true
			continue
		}
		if o.err != nil && strings.Contains(o.err.Error(), "the cluster ended it") && o.endedAt.Before(o.deadline) {
			early++
			if early <= 10 {
				t.Errorf("session %d (%s, received %v) ended by the cluster at %v, its lease valid until %v: %v",
					o.s.ID(), o.where, o.got.Format("15:04:05.000"), o.endedAt.Format("15:04:05.000"), o.deadline.Format("15:04:05.000"), o.err)
			}
		}
	}
	t.Logf("%d sessions received, %d still alive, %d ended by the cluster with a valid lease", len(opened), len(live), early)
	if len(opened) < 50 {
		t.Fatalf("only %d sessions opened: the attack did not run", len(opened))
	}
	var listed []uint64
	deadline := time.Now().Add(ttl)
	for {
		listed = listedSessions(t, ctx, cl)
		if len(listed) == len(live) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var unknown []uint64
	for _, id := range listed {
		if !live[id] {
			unknown = append(unknown, id)
		}
	}
	missing := 0
	for id := range live {
		found := false
		for _, l := range listed {
			found = found || l == id
		}
		if !found {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d sessions alive for their callers are not listed by the cluster", missing)
	}
	if len(unknown) > 0 {
		t.Errorf("%d sessions listed that no caller holds, %v after the faults stopped (TTL %v): %v", len(unknown), ttl+ttl/2, ttl, unknown[:min(len(unknown), 10)])
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("test ctx ran out")
	}
}
