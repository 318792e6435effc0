package quorumlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// liveSessions lists the IDs of the cluster's live sessions.
func liveSessions(t *testing.T, cl *quorumlock.Client) map[uint64]bool {
	t.Helper()
	page, _, err := cl.Sessions(testCtx(t, 10*time.Second), 0, 10000)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[uint64]bool)
	for _, s := range page {
		out[s.ID] = true
	}
	return out
}

// Client.Elect campaigns that fail (ctx deadline, cancellation, a role the
// cluster refuses) close their dedicated session on the cluster and leave
// no goroutine behind once the client closes.
func TestReviewTodayClientElectFailuresLeakNothing(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, Configure: func(cfg *quorumlock.Config) { cfg.MaxNameBytes = 16 }})
	lead := c.WaitLeader(5 * time.Second)
	s := newSession(t, c.Node(lead))
	mustElect(t, s, "busy", "held")
	admin := dial(t, addrsOf(c, c.IDs()...))
	before := liveSessions(t, admin)
	time.Sleep(100 * time.Millisecond)
	ignore := goleak.IgnoreCurrent()

	cl, err := quorumlock.Dial(testCtx(t, 10*time.Second), addrsOf(c, c.IDs()...), quorumlock.WithElectionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	if _, err := cl.Elect(dctx, "busy", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Elect past its deadline: %v", err)
	}
	dcancel()
	cctx, ccancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(200 * time.Millisecond)
		ccancel()
	}()
	if _, err := cl.Elect(cctx, "busy", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Elect: %v", err)
	}
	if _, err := cl.Elect(testCtx(t, 10*time.Second), strings.Repeat("r", 20), nil); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Fatalf("Elect of a role the cluster refuses: %v", err)
	}
	ended, ecancel := context.WithCancel(context.Background())
	ecancel()
	if _, err := cl.Elect(ended, "free", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Elect with an ended ctx: %v", err)
	}
	for id := range liveSessions(t, admin) {
		if !before[id] {
			t.Errorf("session %d of a failed campaign is still live", id)
		}
	}
	if info, err := admin.Leader(testCtx(t, 10*time.Second), "busy"); err != nil || info.Session != s.ID() || len(info.Value) == 0 {
		t.Fatalf("leader after failed campaigns: %+v %v", info, err)
	}
	cl.Close()
	goleak.VerifyNone(t, ignore)
}

// A leader that goes silent (paused: every link to and from it black-holes,
// connections stay open) is left by a client whose calls' contexts are
// shorter than the attempt limit: each such call ended by its own ctx at
// the silent leader, and the client kept the leader for the next one, so
// every call failed until gRPC's keepalive closed the connection (10-20
// s), while a new leader served the others. A client without sessions has
// no heartbeats to learn the new leader from.
func TestReviewTodayShortCallsLeaveSilentLeader(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	t.Cleanup(c.Heal) // before StopAll: a replica closes faster over healed links
	lead := c.WaitLeader(5 * time.Second)
	const me = 99 // the client's end of the network
	cl := dial(t, addrsOf(c, c.IDs()...), quorumlock.WithDialer(c.Net.Dialer(me)), quorumlock.WithElectionTimeout(time.Second))
	probe := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return cl.RevokeSession(ctx, 1<<40) // answered ErrSessionExpired by a leader
	}
	// The client learns the leader.
	if err := probe(10 * time.Second); !errors.Is(err, quorumlock.ErrSessionExpired) {
		t.Fatalf("probe: %v", err)
	}
	if l := c.Leader(); l != lead {
		t.Skipf("leader moved from %d to %d before the pause", lead, l)
	}
	for _, o := range append(c.IDs(), me) {
		if o != lead {
			c.Net.Cut(lead, o)
			c.Net.Cut(o, lead)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if l := c.Leader(); l != 0 && l != lead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no new leader within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Half a second each, under the 2 s attempt limit: five calls take
	// 2.5 s, well inside gRPC's 10 s minimum keepalive interval.
	for i := range 5 {
		err := probe(500 * time.Millisecond)
		if errors.Is(err, quorumlock.ErrSessionExpired) {
			t.Logf("call %d answered by the new leader", i)
			return
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	t.Fatal("five calls in a row timed out at the silent old leader")
}

// A client's Observe that moved with the leader (a failover its heartbeats
// learned) still reports epochs in order with "no leader" between leaders,
// and leaves no goroutine behind once its ctx ends and the client closes.
func TestReviewTodayClientObserveAcrossFailover(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	time.Sleep(100 * time.Millisecond)
	ignore := goleak.IgnoreCurrent()
	cl := dial(t, addrsOf(c, c.IDs()...))
	ctx := testCtx(t, 30*time.Second)
	octx, ocancel := context.WithCancel(ctx)
	events := cl.Observe(octx, "sched")
	if ev := nextEvent(t, events); ev.HasLeader() {
		t.Fatalf("first event %+v", ev)
	}
	s, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ld, err := s.Elect(ctx, "sched", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if ev := nextEvent(t, events); ev.Epoch != ld.Epoch() {
		t.Fatalf("event %+v, want epoch %d", ev, ld.Epoch())
	}
	c.Stop(lead)
	if err := ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	ld2, err := s.Elect(ctx, "sched", []byte("b"))
	if err != nil {
		t.Fatal(err)
	}
	var last quorumlock.LeaderInfo
	for last.Epoch != ld2.Epoch() || !last.HasLeader() {
		ev := nextEvent(t, events)
		if ev.Epoch < last.Epoch || (ev.HasLeader() && last.HasLeader() && ev.Epoch != last.Epoch) {
			t.Fatalf("event %+v after %+v", ev, last)
		}
		last = ev
	}
	ocancel()
	for range events {
	}
	cl.Close()
	// The cluster's own goroutines come and go (redials of the stopped
	// replica): only the client's must be gone.
	for i := 0; ; i++ {
		err := goleak.Find(ignore)
		if err == nil {
			return
		}
		left := ""
		for _, f := range []string{"quorumlock.(*Client)", "quorumlock.observe", "quorumlock.(*propStream)", "quorumlock.(*kaStream)", "quorumlock.(*heartbeater)", "quorumlock.newLeadership"} {
			if strings.Contains(err.Error(), f) {
				left = f
			}
		}
		if left == "" {
			return
		}
		if i == 100 {
			t.Fatalf("a goroutine of the client (%s) outlived Close: %v", left, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
