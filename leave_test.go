package quorumlock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/service"
)

// recorder is a scripted backend handler: it records every request the
// session sends; an acquire waits until its ctx ends (the lock is held by
// another session), a withdrawal is answered WITHDRAWN.
type recorder struct {
	mu   sync.Mutex
	reqs []*lockpb.Request
}

func (r *recorder) handle(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, proto.Clone(req).(*lockpb.Request))
	r.mu.Unlock()
	switch req.GetOp() {
	case lockpb.Op_OP_ACQUIRE:
		<-ctx.Done()
		return nil, ctx.Err()
	case lockpb.Op_OP_WITHDRAW:
		return &lockpb.Response{Code: lockpb.Code_CODE_WITHDRAWN}, nil
	}
	return &lockpb.Response{Code: lockpb.Code_CODE_OK}, nil
}

func (r *recorder) count(op lockpb.Op, name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, q := range r.reqs {
		if q.GetOp() == op && (name == "" || q.GetName() == name) {
			n++
		}
	}
	return n
}

func (r *recorder) snapshot() []*lockpb.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reqs)
}

// toCommand is the command q proposes for session sess (service.Command).
// A request the service refuses before the log, or an op other than the
// four that lock calls send, gives an empty command.
func toCommand(sess uint64, q *lockpb.Request) *fsm.Command {
	c, _, invalid := service.Command(q)
	if invalid != nil || !slices.Contains([]fsm.Op{fsm.OpAcquire, fsm.OpWithdraw, fsm.OpRelease, fsm.OpCloseSession}, c.Op) {
		return &fsm.Command{}
	}
	c.Session = sess
	return &c
}

// replayLate applies the session's recorded requests to a real fsm in the
// order sent, except that the copy of the acquire with seq late arrives
// last (a late copy: still in a forwarding stream, or held at a new leader
// until it is ready). Another session holds "x" throughout and releases it
// at the end. It returns the holder of x afterwards and the session's ID.
func replayLate(t *testing.T, reqs []*lockpb.Request, late uint64) (holder, sid uint64, lateRes fsm.Result) {
	var other uint64
	t.Helper()
	m := fsm.New(fsm.Limits{})
	idx := uint64(0)
	apply := func(c *fsm.Command) (fsm.Result, []fsm.Event) {
		idx++
		return m.Apply(idx, 1, c)
	}
	ro, _ := apply(&fsm.Command{Op: fsm.OpOpenSession, TTL: int64(10 * time.Second)})
	rs, _ := apply(&fsm.Command{Op: fsm.OpOpenSession, TTL: int64(10 * time.Second)})
	other, sid = ro.Session, rs.Session
	if r, _ := apply(&fsm.Command{Op: fsm.OpAcquire, Session: other, Seq: 1, Done: 1, Name: "x"}); r.Code != fsm.CodeOK {
		t.Fatalf("other's acquire: %+v", r)
	}
	var lateReq *lockpb.Request
	for _, q := range reqs {
		if q.GetOp() == lockpb.Op_OP_ACQUIRE && q.GetSeq() == late {
			lateReq = q
			continue
		}
		r, _ := apply(toCommand(sid, q))
		if q.GetName() != "x" {
			continue
		}
		t.Logf("applied %v seq %d done %d listed %v pending %v target %d name %q -> %+v",
			q.GetOp(), q.GetSeq(), q.GetDone(), q.GetListed(), q.GetPending(), q.GetTarget(), q.GetName(), r)
	}
	lateRes, _ = apply(toCommand(sid, lateReq))
	t.Logf("late copy of acquire seq %d -> %+v", late, lateRes)
	r, ev := apply(&fsm.Command{Op: fsm.OpRelease, Session: other, Seq: 2, Done: 2, Name: "x", Token: 3})
	t.Logf("other releases x -> %+v, events %+v", r, ev)
	return m.Holder("x").Holder, sid, lateRes
}

func hasLock(s *Session, name string) bool {
	for _, l := range s.Locks() {
		if l.Name() == name {
			return true
		}
	}
	return false
}

// Two Acquire calls of one session wait for x; the first gives up and
// leaves the place to the second, taking back its own request only; then
// the second gives up and withdraws the place. A late copy of the first
// call's acquire (still in a forwarding stream, or held at a new leader),
// applied after both, must take no effect: before the first call took its
// request back, with more than maxListed requests in flight (so that
// nothing retired it) the copy queued the session again, and the session
// was later granted x, which no Lock of it represents (found by a review).
func TestLeftAcquireTakenBack(t *testing.T) {
	t.Parallel()
	be, _, s := newLeaseHarness(t, true)
	rec := &recorder{}
	be.mu.Lock()
	be.handle = rec.handle
	be.mu.Unlock()

	bg, stopBg := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stopBg(); wg.Wait() }()
	// 33 other acquires in flight (waiting elsewhere): more than maxListed.
	for i := range maxListed + 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Acquire(bg, "o"+string(rune('a'+i)))
		}()
		eventually(t, "other acquire sent", func() bool { return rec.count(lockpb.Op_OP_ACQUIRE, "") == i+1 })
	}
	ctxA, cancelA := context.WithCancel(context.Background())
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	errA, errB := make(chan error, 1), make(chan error, 1)
	go func() { _, err := s.Acquire(ctxA, "x"); errA <- err }()
	eventually(t, "A sent", func() bool { return rec.count(lockpb.Op_OP_ACQUIRE, "x") == 1 })
	go func() { _, err := s.Acquire(ctxB, "x"); errB <- err }()
	eventually(t, "B sent", func() bool { return rec.count(lockpb.Op_OP_ACQUIRE, "x") == 2 })

	cancelA()
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Fatalf("A: %v", err)
	}
	if n := rec.count(lockpb.Op_OP_WITHDRAW, "x"); n != 0 {
		t.Fatalf("A withdrew the place (%d), expected it to leave it to B", n)
	}
	cancelB()
	if err := <-errB; !errors.Is(err, context.Canceled) {
		t.Fatalf("B: %v", err)
	}
	if hasLock(s, "x") || s.Err() != nil {
		t.Fatalf("client state: lock %v, err %v", hasLock(s, "x"), s.Err())
	}
	reqs := rec.snapshot()
	var seqA uint64
	for _, q := range reqs {
		if q.GetOp() == lockpb.Op_OP_ACQUIRE && q.GetName() == "x" {
			seqA = q.GetSeq()
			break
		}
	}
	holder, sid, late := replayLate(t, reqs, seqA)
	if holder == sid {
		t.Fatalf("phantom grant: the cluster granted x to session %d (late acquire seq %d answered %+v) but both "+
			"Acquire calls returned context.Canceled and the session holds no Lock for x; "+
			"expected the late copy to take no effect (CodeInvalid/CodeWithdrawn)", sid, seqA, late)
	}
}
