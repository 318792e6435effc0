package quorumlock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// Hostile remote: random malformed requests through every RPC; afterwards
// every replica must still run, agree on the lock and session tables, and
// the cluster must still serve a well-formed client.
func TestBadInputGRPCGarbageKeepsReplicasConsistent(t *testing.T) {
	t.Parallel()
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	var clis []lockpb.LockClient
	for _, id := range c.IDs() {
		clis = append(clis, dialLeader(t, c.Node(id)))
	}
	lc := dialLeader(t, c.Node(lead))
	// A few real sessions to aim at.
	var real []uint64
	for range 3 {
		r, err := lc.Propose(testCtx(t, 5*time.Second), &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: 60_000})
		if err != nil || r.GetCode() != lockpb.Code_CODE_OK {
			t.Fatalf("open: %v %v", r, err)
		}
		real = append(real, r.GetSession())
	}
	rnd := rand.New(rand.NewPCG(3, 4))
	names := []string{"", "a", "b", "\x00", "\x00a", "\x00\x00a", "a\x00", "\xff", "\xc3", strings.Repeat("x", 256), strings.Repeat("x", 257), strings.Repeat("é", 200), "\x00" + strings.Repeat("x", 256)}
	u64s := func() uint64 {
		switch rnd.IntN(6) {
		case 0:
			return 0
		case 1:
			return ^uint64(0)
		case 2:
			return 1 << 63
		default:
			return uint64(rnd.IntN(40))
		}
	}
	randReq := func() *lockpb.Request {
		r := &lockpb.Request{
			Op:     lockpb.Op(rnd.IntN(10) - 1),
			Seq:    u64s(),
			Done:   u64s(),
			Name:   names[rnd.IntN(len(names))],
			Try:    rnd.IntN(2) == 0,
			NoWait: rnd.IntN(2) == 0,
			Token:  u64s(),
			Target: u64s(),
			TtlMs:  int64(u64s()),
			Listed: rnd.IntN(2) == 0,
		}
		if rnd.IntN(3) > 0 {
			r.Session = real[rnd.IntN(len(real))]
		} else {
			r.Session = u64s()
		}
		if rnd.IntN(4) == 0 {
			r.Value = make([]byte, rnd.IntN(3)*40000)
		}
		for range rnd.IntN(40) {
			r.Pending = append(r.Pending, u64s())
		}
		if r.GetOp() == lockpb.Op_OP_REVOKE {
			r.Op = lockpb.Op_OP_ACQUIRE
		}
		return r
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 1500 {
		cli := clis[rnd.IntN(len(clis))]
		rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, _ = cli.Propose(rctx, randReq())
		rcancel()
		if i%10 == 0 {
			rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, _ = cli.Holder(rctx, &lockpb.HolderRequest{Name: names[rnd.IntN(len(names))]})
			_, _ = cli.ListLocks(rctx, &lockpb.ListRequest{AfterName: names[rnd.IntN(len(names))], AfterId: u64s(), Limit: uint32(u64s())})
			_, _ = cli.ListSessions(rctx, &lockpb.ListRequest{AfterName: names[rnd.IntN(len(names))], AfterId: u64s(), Limit: uint32(u64s())})
			rcancel()
		}
	}
	// Streams: duplicate ids, cancels of unknown ids, nil requests.
	for _, cli := range clis {
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cli.ProposeStream(sctx)
		if err != nil {
			t.Fatal(err)
		}
		var calls []*lockpb.ProposeCall
		for range 50 {
			calls = append(calls, &lockpb.ProposeCall{Id: uint64(rnd.IntN(5)), Request: randReq(), Cancel: rnd.IntN(4) == 0})
		}
		calls = append(calls, &lockpb.ProposeCall{Id: 99}, &lockpb.ProposeCall{Id: 12345, Cancel: true})
		_ = st.Send(&lockpb.ProposeCalls{Calls: calls})
		_ = st.CloseSend()
		for {
			if _, err := st.Recv(); err != nil {
				break
			}
		}
		scancel()
		kctx, kcancel := context.WithTimeout(ctx, time.Second)
		ka, err := cli.KeepAlive(kctx)
		if err != nil {
			t.Fatal(err)
		}
		for range 20 {
			var ids []uint64
			for range rnd.IntN(2000) {
				ids = append(ids, u64s())
			}
			_ = ka.Send(&lockpb.KeepAliveRequest{Batch: u64s(), Sessions: ids})
		}
		_ = ka.CloseSend()
		for {
			if _, err := ka.Recv(); err != nil {
				break
			}
		}
		kcancel()
		octx, ocancel := context.WithTimeout(ctx, 300*time.Millisecond)
		for _, n := range names {
			ob, err := cli.Observe(octx, &lockpb.HolderRequest{Name: n})
			if err == nil {
				_, _ = ob.Recv()
			}
		}
		ocancel()
	}
	// Barrier: a well-formed write, then wait for every replica to apply it.
	r, err := lc.Propose(testCtx(t, 5*time.Second), &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: 60_000})
	if err != nil || r.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("cluster no longer serves a well-formed open: %v %v", r, err)
	}
	snap := func(cli lockpb.LockClient) string {
		lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
		defer lcancel()
		ll, err := cli.ListLocks(lctx, &lockpb.ListRequest{Limit: 10000})
		if err != nil {
			t.Fatalf("ListLocks: %v", err)
		}
		ls, err := cli.ListSessions(lctx, &lockpb.ListRequest{Limit: 10000})
		if err != nil {
			t.Fatalf("ListSessions: %v", err)
		}
		return fmt.Sprint(ll.GetLocks(), "|", ls.GetSessions())
	}
	want := snap(clis[0])
	for i, cli := range clis[1:] {
		if got := snap(cli); !reflect.DeepEqual(got, want) {
			t.Errorf("replica %d table differs:\n%s\nvs\n%s", i+2, got, want)
		}
	}
	for _, id := range c.IDs() {
		if n := c.Node(id); n == nil || closed(n.Done()) {
			t.Errorf("replica %d stopped", id)
		}
	}
}
