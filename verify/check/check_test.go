package check

import (
	"slices"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/verify/history"
)

const msec = int64(time.Millisecond)

// hist builds a history of lock "l" by hand; times are in msec.
type hist struct{ h *history.History }

func newHist() *hist { return &hist{h: history.New(1, []string{"l"})} }

func (b *hist) session(id uint64, deadline int64) *history.Session {
	s := &history.Session{ID: id, TTL: 1000 * msec, Margin: 100 * msec, Deadline: deadline * msec, ListedAtEnd: true}
	b.h.Sessions = append(b.h.Sessions, s)
	return s
}

func (b *hist) op(kind history.Kind, s uint64, out history.Outcome, token uint64, call, ret int64) {
	r := ret * msec
	if ret < 0 {
		r = history.Open
	}
	b.h.Ops = append(b.h.Ops, history.Op{Client: int(s % 7), Kind: kind, Lock: "l", Session: s, Token: token, Outcome: out, Call: call * msec, Return: r})
}

func (b *hist) read(holder, token uint64, call, ret int64, final bool) {
	b.h.Ops = append(b.h.Ops, history.Op{Client: 9, Kind: history.Read, Lock: "l", Holder: holder, Token: token, Call: call * msec, Return: ret * msec, Final: final})
}

func (b *hist) write(s, token uint64, start, end int64) {
	b.h.Writes = append(b.h.Writes, history.Write{Lock: "l", Session: s, Token: token, Seq: len(b.h.Writes), Accepted: true, Start: start * msec, End: end * msec})
}

func fired(t *testing.T, b *hist) []string {
	t.Helper()
	r := Run(b.h, Options{Timeout: 10 * time.Second})
	for _, v := range r.Violations {
		t.Log(v)
	}
	return r.Fired()
}

func want(t *testing.T, got []string, checkers ...string) {
	t.Helper()
	slices.Sort(checkers)
	if !slices.Equal(got, checkers) {
		t.Fatalf("fired %v, want %v", got, checkers)
	}
}

// A correct hand-off: s1 acquires, writes, releases; s2 was waiting and
// gets the lock with a larger token; a cancelled and an ambiguous acquire
// and an expired session are all consistent.
func TestCorrectHistoryPasses(t *testing.T) {
	b := newHist()
	b.session(1, 5000)
	b.session(2, 5000)
	s30 := b.session(3, 900) // ends by expiry, no close sent
	s30.Ended, s30.Cause, s30.ListedAtEnd, s30.Gone = 950*msec, history.EndProcess, false, 4000*msec
	b.op(history.Acquire, 1, history.OK, 11, 0, 10)
	b.write(1, 11, 12, 15)
	b.op(history.Acquire, 2, history.OK, 40, 5, 60)
	b.op(history.Try, 3, history.Locked, 0, 20, 25)
	b.op(history.Release, 1, history.OK, 11, 50, 55)
	b.write(2, 40, 61, 64)
	b.op(history.Release, 2, history.OK, 40, 70, 75)
	b.op(history.Acquire, 2, history.Cancelled, 0, 76, 90)
	b.op(history.Acquire, 3, history.OK, 50, 100, 110)
	b.read(3, 50, 120, 125, false)
	b.op(history.Acquire, 1, history.Ambiguous, 0, 130, -1)
	// s3 expires no earlier than 1000 msec (deadline 900 + margin 100).
	b.op(history.Acquire, 2, history.OK, 90, 200, 1100)
	b.read(2, 90, 1200, 1210, true)
	want(t, fired(t, b))
}

func TestDoubleGrantIsCaught(t *testing.T) {
	b := newHist()
	b.session(1, 5000)
	b.session(2, 5000)
	b.op(history.Acquire, 1, history.OK, 11, 0, 10)
	b.write(1, 11, 20, 40)
	b.op(history.Acquire, 2, history.OK, 12, 15, 25)
	b.write(2, 12, 30, 35)
	b.op(history.Release, 2, history.OK, 12, 50, 55)
	b.op(history.Release, 1, history.OK, 11, 60, 65)
	b.read(0, 0, 100, 110, true)
	want(t, fired(t, b), Linearizable, Exclusion, Lease)
}

func TestTokenReuseIsCaught(t *testing.T) {
	b := newHist()
	b.session(1, 5000)
	b.session(2, 5000)
	b.op(history.Acquire, 1, history.OK, 11, 0, 10)
	b.write(1, 11, 12, 15)
	b.op(history.Release, 1, history.OK, 11, 20, 25)
	b.op(history.Acquire, 2, history.OK, 11, 30, 35)
	b.write(2, 11, 36, 40)
	b.op(history.Release, 2, history.OK, 11, 50, 55)
	b.read(0, 0, 100, 110, true)
	want(t, fired(t, b), Linearizable, Exclusion, Tokens)
}

func TestLostAcknowledgedAcquireIsCaught(t *testing.T) {
	b := newHist()
	b.session(1, 5000)
	b.op(history.Acquire, 1, history.OK, 11, 0, 10)
	b.read(0, 0, 100, 110, true)
	want(t, fired(t, b), Linearizable, Final, Lease)
}

func TestLostAcknowledgedReleaseIsCaught(t *testing.T) {
	b := newHist()
	b.session(1, 5000)
	b.op(history.Acquire, 1, history.OK, 11, 0, 10)
	b.op(history.Release, 1, history.OK, 11, 20, 30)
	b.read(1, 11, 100, 110, true)
	want(t, fired(t, b), Linearizable, Final)
}

// The cluster frees a lock whose holder's lease runs until 900 msec, with no
// close sent, at 500 msec.
func TestEarlyExpiryIsCaught(t *testing.T) {
	b := newHist()
	s := b.session(1, 900)
	s.Ended, s.Cause, s.ListedAtEnd, s.Gone = 520*msec, history.EndCluster, false, 2000*msec
	b.session(2, 5000)
	b.op(history.Acquire, 1, history.OK, 11, 0, 10)
	b.op(history.Acquire, 2, history.OK, 30, 100, 500)
	b.read(2, 30, 600, 610, true)
	want(t, fired(t, b), Linearizable, Lease)
}

// A grant that ends while its session's holder is still writing is what
// fencing is for: the write that outlived the lease is counted as late,
// not reported.
func TestLateWriteAfterLeaseIsNotAViolation(t *testing.T) {
	b := newHist()
	s := b.session(1, 900)
	s.Ended, s.Cause, s.ListedAtEnd, s.Gone = 900*msec, history.EndLease, false, 3000*msec
	b.session(2, 5000)
	b.op(history.Acquire, 1, history.OK, 11, 0, 10)
	b.write(1, 11, 850, 1100) // paused past its lease
	b.op(history.Acquire, 2, history.OK, 30, 100, 950)
	b.write(2, 30, 960, 970)
	b.read(2, 30, 1200, 1210, true)
	r := Run(b.h, Options{})
	if r.Failed() || r.LateWrites != 1 {
		t.Fatalf("violations %v, late writes %d", r.Violations, r.LateWrites)
	}
}

func TestStaleWriteAcceptedIsCaught(t *testing.T) {
	b := newHist()
	b.session(1, 5000)
	b.op(history.Acquire, 1, history.OK, 11, 0, 10)
	b.op(history.Release, 1, history.OK, 11, 20, 25)
	b.op(history.Acquire, 1, history.OK, 30, 30, 35)
	b.write(1, 30, 36, 37)
	b.write(1, 11, 38, 39)
	b.read(1, 30, 100, 110, true)
	want(t, fired(t, b), Exclusion)
}

func TestSlowRecoveryIsCaught(t *testing.T) {
	b := newHist()
	b.h.Bound = 400 * msec
	b.h.Recover = []history.Recovery{
		{Fault: "isolate-leader", Lost: 0, Elected: 150 * msec, Recovered: 200 * msec, Bounded: true},
		{Fault: "isolate-leader", Lost: 1000 * msec, Elected: 1150 * msec, Recovered: 1500 * msec, Bounded: true},
		{Fault: "restart-all", Lost: 2000 * msec, Recovered: 4000 * msec, Bounded: false},
	}
	b.read(0, 0, 100, 110, true)
	r := Run(b.h, Options{})
	want(t, r.Fired(), Availability)
	if len(r.Recoveries) != 2 || len(r.Unbounded) != 1 || len(r.Violations) != 1 {
		t.Fatalf("%+v", r)
	}
}

// An acquire that returned ErrWithdrawPending (ambiguous, plus the
// background withdrawal's release of whatever grant it made, token 0):
// its grant may be seen by a read and is then freed without a release by
// the client, and another session takes the lock.
func TestWithdrawPendingGrantReleasedPasses(t *testing.T) {
	b := newHist()
	b.session(1, 5000)
	b.session(2, 5000)
	b.op(history.Acquire, 1, history.Ambiguous, 0, 0, -1)
	b.op(history.Release, 1, history.Ambiguous, 0, 30, -1)
	b.read(1, 11, 40, 45, false)
	b.op(history.Try, 2, history.Locked, 0, 50, 55)
	b.op(history.Acquire, 2, history.OK, 20, 60, 70)
	b.read(2, 20, 100, 110, true)
	want(t, fired(t, b))
}

// The background withdrawal's release frees only a grant that no acquire
// of the session returned: a grant the client was told of (an OK
// acquire) stays held, so another session granted the lock meanwhile is
// a double grant.
func TestWithdrawPendingReleaseKeepsAcknowledgedGrant(t *testing.T) {
	b := newHist()
	b.session(1, 5000)
	b.session(2, 5000)
	b.op(history.Acquire, 1, history.OK, 11, 0, 10)
	b.op(history.Acquire, 1, history.Ambiguous, 0, 20, -1)
	b.op(history.Release, 1, history.Ambiguous, 0, 30, -1)
	b.op(history.Acquire, 2, history.OK, 20, 40, 50)
	b.read(2, 20, 100, 110, true)
	got := fired(t, b)
	if !slices.Contains(got, Linearizable) {
		t.Fatalf("fired %v, want %s among them", got, Linearizable)
	}
}
