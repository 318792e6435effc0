package quorumlock_test

import (
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// proposeAtLeader sends req to the current leader, following leader
// changes, until it is answered with anything but NOT_LEADER or
// UNAVAILABLE.
func proposeAtLeader(t *testing.T, c *testcluster.Cluster, req *lockpb.Request) *lockpb.Response {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		lead := c.WaitLeader(10 * time.Second)
		n := c.Node(lead)
		if n == nil {
			continue
		}
		r, err := dialLeader(t, n).Propose(testCtx(t, 5*time.Second), req)
		if err == nil && r.GetCode() != lockpb.Code_CODE_NOT_LEADER && r.GetCode() != lockpb.Code_CODE_UNAVAILABLE {
			return r
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no leader answered %v", req)
	return nil
}

// Invariants 2, 6 and 7 across snapshots and restarts, on both log
// backends: the dedupe table travels in snapshots (taken every few
// entries, with the log compacted behind them), in the one a lagging
// follower receives from the leader, and through a restart of every
// replica from its snapshot. Re-sent requests return their original
// outcomes and change nothing; tokens keep increasing.
func TestReviewDedupeAcrossSnapshotsAndRestarts(t *testing.T) {
	for _, backend := range []quorumlock.LogBackend{quorumlock.LogPebble, quorumlock.LogWAL} {
		t.Run(string(backend), func(t *testing.T) {
			c := testcluster.New(t, testcluster.Options{Size: 3, Configure: func(cfg *quorumlock.Config) {
				cfg.LogBackend = backend
				cfg.SnapshotEntries = 20
			}})
			lead := c.WaitLeader(10 * time.Second)
			lagging := follower(c, lead)

			open := func() uint64 {
				r := proposeAtLeader(t, c, &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: (5 * time.Minute).Milliseconds()})
				if r.GetCode() != lockpb.Code_CODE_OK {
					t.Fatalf("open session: %v", r)
				}
				return r.GetSession()
			}
			a, b, filler := open(), open(), open()

			acqA := &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: a, Seq: 1, Done: 1, Name: "d"}
			ra := proposeAtLeader(t, c, acqA)
			if ra.GetCode() != lockpb.Code_CODE_OK || ra.GetQueued() {
				t.Fatalf("acquire by a: %v", ra)
			}
			acqB := &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: b, Seq: 1, Done: 1, Name: "d", NoWait: true}
			if rb := proposeAtLeader(t, c, acqB); rb.GetCode() != lockpb.Code_CODE_OK || !rb.GetQueued() {
				t.Fatalf("acquire by b: %v, want queued", rb)
			}

			// The lagging follower misses what follows, compacted away
			// behind the leader's snapshots.
			c.Stop(lagging)
			seq := uint64(0)
			fill := func(n int) {
				for range n {
					seq++
					r := proposeAtLeader(t, c, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: filler, Seq: seq, Done: seq, Name: "f", Try: true})
					if r.GetCode() != lockpb.Code_CODE_OK {
						t.Fatalf("filler acquire: %v", r)
					}
					seq++
					r = proposeAtLeader(t, c, &lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: filler, Seq: seq, Done: seq, Name: "f", Token: r.GetToken()})
					if r.GetCode() != lockpb.Code_CODE_OK {
						t.Fatalf("filler release: %v", r)
					}
				}
			}
			fill(40)
			c.Restart(lagging) // catches up from the leader's snapshot
			fill(20)
			commit := c.Node(c.WaitLeader(10 * time.Second)).Status().Commit
			for deadline := time.Now().Add(20 * time.Second); c.Node(lagging).Status().Applied < commit; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("replica %d did not catch up to %d", lagging, commit)
				}
			}

			c.StopAll()
			for _, id := range c.IDs() {
				c.Restart(id)
			}

			if r := proposeAtLeader(t, c, acqA); r.GetCode() != lockpb.Code_CODE_OK || r.GetToken() != ra.GetToken() {
				t.Fatalf("re-sent acquire by a after restarts: %v, want token %d", r, ra.GetToken())
			}
			if r := proposeAtLeader(t, c, acqB); r.GetCode() != lockpb.Code_CODE_OK || !r.GetQueued() {
				t.Fatalf("re-sent acquire by b after restarts: %v, want still queued", r)
			}
			relA := &lockpb.Request{Op: lockpb.Op_OP_RELEASE, Session: a, Seq: 2, Done: 1, Name: "d", Token: ra.GetToken()}
			if r := proposeAtLeader(t, c, relA); r.GetCode() != lockpb.Code_CODE_OK {
				t.Fatalf("release by a: %v", r)
			}
			// b's queued acquire now reports its grant.
			rb := proposeAtLeader(t, c, acqB)
			if rb.GetCode() != lockpb.Code_CODE_OK || rb.GetQueued() || rb.GetToken() <= ra.GetToken() {
				t.Fatalf("re-sent acquire by b after the release: %v, want a grant above token %d", rb, ra.GetToken())
			}
			// a's acquire and release, replayed, change nothing.
			for _, req := range []*lockpb.Request{acqA, relA} {
				if r := proposeAtLeader(t, c, req); r.GetCode() != lockpb.Code_CODE_OK || r.GetToken() != ra.GetToken() {
					t.Fatalf("replayed %v: %v, want OK with token %d", req.GetOp(), r, ra.GetToken())
				}
			}
			for _, id := range c.IDs() {
				if info := holder(t, c.Node(id), "d"); info.Holder != b || info.Token != quorumlock.Token(rb.GetToken()) {
					t.Fatalf("replica %d: holder %+v, want session %d with token %d", id, info, b, rb.GetToken())
				}
			}
		})
	}
}
