package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// Under faults (the leader crashed and restarted, a replica isolated and
// healed, a leader closed gracefully, slow and lossy links, a client cut
// off past its sessions' TTL) every error any call of the public
// API returns, through replicas and through remote Clients, is one of the
// package's sentinels or the ctx's error: never a raw gRPC status, a
// transport error or raft's. A caller can only handle what errors.Is can
// name. Tokens a session is granted for a name grow in the order it got
// them; a Release with Lost open is never ErrNotHeld (unless an earlier
// Release of that grant ended with ErrUnknownOutcome, which keeps Lost
// open: it may have freed the lock); a Holder read after
// a grant never shows an older token, and shows another session's later
// grant only once this session's Lost has closed.
// Leader shows a leadership whose Done is open as this session's.
func TestReviewAAErrorsUnderFaultsAreSentinels(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	c.WaitLeader(5 * time.Second)
	var clients []*quorumlock.Client
	for i := range 2 {
		clients = append(clients, dial(t, addrsOf(c, c.IDs()...), quorumlock.WithDialer(c.Net.Dialer(uint64(100+i)))))
	}
	var mu sync.Mutex
	others := map[string]int{}
	seen := map[string]int{}
	record := func(what string, err error) {
		class := aaClass(err)
		mu.Lock()
		defer mu.Unlock()
		seen[what+" "+strings.SplitN(class, ":", 2)[0]]++
		if strings.HasPrefix(class, "other") {
			others[what+": "+err.Error()]++
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			var s *quorumlock.Session
			var locks []*quorumlock.Lock
			var leads []*quorumlock.Leadership
			last := map[string]quorumlock.Token{}
			// unsettled: grants a Release of which ended with
			// ErrUnknownOutcome (it may have freed them; their Lost
			// stays open).
			unsettled := map[quorumlock.Token]bool{}
			var hist []string
			note := func(format string, args ...any) {
				hist = append(hist, fmt.Sprintf(format, args...))
			}
			// granted checks a lock just returned: the same grant as
			// before, or a new one with a larger token.
			granted := func(l *quorumlock.Lock) {
				if l.Token() < last[l.Name()] {
					t.Errorf("worker %d: a grant of %s with token %d after %d", w, l.Name(), l.Token(), last[l.Name()])
				}
				last[l.Name()] = max(last[l.Name()], l.Token())
				// Acquiring a held name returns the same Lock: listed
				// once, so one Release takes it off the list.
				if !slices.Contains(locks, l) {
					locks = append(locks, l)
				}
			}
			for {
				select {
				case <-stop:
					if s != nil {
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
						s.Close(ctx)
						cancel()
					}
					return
				default:
				}
				var o opener
				if w < 4 {
					o = clients[w%2]
				} else {
					run := c.Running()
					if len(run) == 0 {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					n := c.Node(run[rnd.IntN(len(run))])
					if n == nil {
						continue
					}
					o = n
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(50+rnd.IntN(400))*time.Millisecond)
				name := fmt.Sprint("c", rnd.IntN(3))
				if s == nil || closed(s.Done()) {
					if s != nil {
						record("Session.Err", s.Err())
					}
					var err error
					s, err = o.NewSession(ctx)
					record("NewSession", err)
					locks, leads, last = nil, nil, map[string]quorumlock.Token{}
					if s != nil {
						note("session %d opened", s.ID())
					}
					cancel()
					continue
				}
				switch rnd.IntN(9) {
				case 0, 1:
					l, err := s.Acquire(ctx, name)
					record("Acquire", err)
					note("Acquire(%s): %v %s", name, l.Token(), aaClass(err))
					if err == nil {
						granted(l)
					}
				case 2:
					l, err := s.TryAcquire(ctx, name)
					record("TryAcquire", err)
					note("TryAcquire(%s): %v %s", name, l.Token(), aaClass(err))
					if err == nil {
						granted(l)
					}
				case 3, 4:
					if len(locks) > 0 {
						i := rnd.IntN(len(locks))
						l := locks[i]
						wasLost := closed(l.Lost())
						err := l.Release(ctx)
						record("Release", err)
						note("Release(%s, %d): %s (Lost was closed: %v)", l.Name(), l.Token(), aaClass(err), wasLost)
						if errors.Is(err, quorumlock.ErrUnknownOutcome) {
							unsettled[l.Token()] = true
						}
						if errors.Is(err, quorumlock.ErrNotHeld) && !wasLost && !unsettled[l.Token()] {
							// Nothing else of this session's touched
							// the grant: its Lost was open, so the
							// session believed it held the lock.
							t.Errorf("worker %d: Release of %s (token %d), Lost open before it: ErrNotHeld; history:\n%s", w, l.Name(), l.Token(), strings.Join(hist[max(0, len(hist)-25):], "\n"))
						}
						locks = slices.Delete(locks, i, i+1)
					}
				case 5:
					info, err := o.Holder(ctx, name)
					record("Holder", err)
					if err != nil {
						break
					}
					// Linearizable, and a grant is lost before another
					// session's: a lock this session was granted
					// with token T reads as T (held by it), or as a
					// later grant, and then, if another session's,
					// this one's Lost has already closed, unless a
					// Release of the grant ended with ErrUnknownOutcome
					// (it may have freed the lock, and Lost stays open;
					// an Acquire answered before that Release applied
					// returns the same grant again).
					for _, l := range locks {
						if l.Name() != name || unsettled[l.Token()] {
							continue
						}
						switch {
						case info.Token < l.Token() && info.Holder != 0:
							t.Errorf("worker %d: Holder(%s) read token %d after the session was granted %d", w, name, info.Token, l.Token())
						case info.Token == l.Token() && info.Holder != s.ID():
							t.Errorf("worker %d: Holder(%s) = %+v, but token %d is session %d's", w, name, info, l.Token(), s.ID())
						case info.Token > l.Token() && info.Holder != s.ID() && !closed(l.Lost()):
							t.Errorf("worker %d: %s granted to session %d (token %d) while this session's grant %d has Lost open; history:\n%s", w, name, info.Holder, info.Token, l.Token(), strings.Join(hist[max(0, len(hist)-25):], "\n"))
						}
					}
				case 6:
					ld, err := s.Elect(ctx, "r"+name, []byte("v"))
					record("Elect", err)
					if err == nil {
						leads = append(leads, ld)
					}
				case 7:
					if len(leads) > 0 {
						i := rnd.IntN(len(leads))
						if rnd.IntN(2) == 0 {
							record("Proclaim", leads[i].Proclaim(ctx, []byte("p")))
						} else {
							record("Resign", leads[i].Resign(ctx))
							leads = slices.Delete(leads, i, i+1)
						}
					}
				case 8:
					info, err := o.Leader(ctx, "r"+name)
					noLeader := errors.Is(err, quorumlock.ErrNoLeader)
					if !noLeader {
						record("Leader", err)
					}
					if err != nil && !noLeader {
						break
					}
					// As for Holder: a leadership this session holds
					// (Done open) is what the read shows.
					for _, ld := range leads {
						if ld.Role() != "r"+name || closed(ld.Done()) {
							continue
						}
						if noLeader || info.Epoch != ld.Epoch() || info.Session != s.ID() {
							t.Errorf("worker %d: Leader(r%s) = %+v, %v while this session leads it at epoch %d (Done open)", w, name, info, err, ld.Epoch())
						}
					}
				}
				cancel()
			}
		}()
	}
	rnd := rand.New(rand.NewPCG(99, 99))
	for round := range 10 {
		time.Sleep(400 * time.Millisecond)
		lead := c.WaitLeader(10 * time.Second)
		switch round % 5 {
		case 3:
			// Slow links around the leader, clients' links included.
			for _, id := range append(c.IDs(), 100, 101) {
				if id != lead {
					c.Net.SetDelay(lead, id, 30*time.Millisecond)
					c.Net.SetDelay(id, lead, 30*time.Millisecond)
				}
			}
			time.Sleep(time.Second)
			c.Heal()
		case 4:
			// Lossy links: a write breaks its connection now and then.
			for _, a := range append(c.IDs(), 100, 101) {
				for _, b := range c.IDs() {
					if a != b {
						c.Net.SetDrop(a, b, 0.02)
						c.Net.SetDrop(b, a, 0.02)
					}
				}
			}
			time.Sleep(time.Second)
			c.Heal()
		case 0:
			c.Stop(lead)
			time.Sleep(time.Duration(100+rnd.IntN(300)) * time.Millisecond)
			c.Restart(lead)
		case 1:
			c.Isolate(lead)
			time.Sleep(time.Duration(100+rnd.IntN(500)) * time.Millisecond)
			c.Heal()
		case 2:
			c.Close(lead)
			c.Restart(lead)
		}
	}
	// Cut the first client off from every replica for longer than the
	// TTL: its sessions end (lease run out, then expired on the cluster)
	// and its calls, NewSession included, fail meanwhile.
	for _, id := range c.IDs() {
		c.Net.Cut(100, id)
		c.Net.Cut(id, 100)
	}
	time.Sleep(5 * time.Second)
	c.Heal()
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	var keys []string
	for k, n := range seen {
		keys = append(keys, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(keys)
	t.Logf("outcomes: %s", strings.Join(keys, " "))
	for e, n := range others {
		t.Errorf("a non-sentinel error (%d times): %s", n, e)
	}
}
