package quorumlock_test

// Review P: a foreign client calling the raw gRPC service. Each check here
// kills a mutation of a server-side check that the library's own clients
// never reach (they check first).

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// rawCodec sends a request's bytes as they are and decodes answers as
// protobuf: it lets the test put bytes on the wire that the generated code
// refuses to marshal (invalid UTF-8 in a string field).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.(*[]byte); ok {
		return *b, nil
	}
	return proto.Marshal(v.(proto.Message))
}
func (rawCodec) Unmarshal(b []byte, v any) error { return proto.Unmarshal(b, v.(proto.Message)) }
func (rawCodec) Name() string                    { return "proto" }

// Bad names, values, ops and pending lists sent over raw gRPC by a foreign
// client are answered CODE_INVALID by the service before anything is
// proposed: the leader's commit index does not move, and the replica keeps
// serving.
func TestReviewPRawGRPCBadInputNeverReachesTheLog(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3})
	lead := c.WaitLeader(5 * time.Second)
	cli := dialLeader(t, c.Node(lead))
	ctx := testCtx(t, 20*time.Second)
	open, err := cli.Propose(ctx, &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: 60_000})
	if err != nil || open.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("open: %v %v", open, err)
	}
	sid := open.GetSession()

	long := strings.Repeat("x", 257)
	var reqs []*lockpb.Request
	for _, op := range []lockpb.Op{lockpb.Op_OP_ACQUIRE, lockpb.Op_OP_RELEASE, lockpb.Op_OP_WITHDRAW, lockpb.Op_OP_PROCLAIM} {
		for _, name := range []string{"", long, "nul\x00byte", "\x00", "\x00" + long, "\x00a\x00"} {
			reqs = append(reqs, &lockpb.Request{Op: op, Session: sid, Seq: 1, Name: name, Token: 1})
		}
	}
	reqs = append(reqs,
		&lockpb.Request{Op: lockpb.Op_OP_PROCLAIM, Session: sid, Seq: 1, Name: "\x00role", Value: make([]byte, 4097)},
		&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: sid, Seq: 1, Name: "\x00role", Value: make([]byte, 4097)},
		&lockpb.Request{Op: lockpb.Op(99), Session: sid, Seq: 1, Name: "a"},
		&lockpb.Request{Op: lockpb.Op(-7), Session: sid, Seq: 1, Name: "a"},
		// pending must be strictly increasing, below seq, at most MaxListed.
		&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: sid, Seq: 5, Name: "a", Listed: true, Pending: []uint64{3, 2}},
		&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: sid, Seq: 5, Name: "a", Listed: true, Pending: []uint64{2, 2}},
		&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: sid, Seq: 5, Name: "a", Listed: true, Pending: []uint64{5}},
		&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: sid, Seq: 5, Name: "a", Listed: true, Pending: []uint64{9}},
		&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: sid, Seq: 1 << 20, Name: "a", Listed: true, Pending: seqs(1, 1026)},
	)
	// A round in which the term moved is run again (sameTermWindow), at
	// the leader of the moment.
	before, after := sameTermWindow(t, 5, func(int) (quorumlock.Status, quorumlock.Status) {
		if l := c.WaitLeader(5 * time.Second); l != lead {
			lead, cli = l, dialLeader(t, c.Node(l))
		}
		waitFor(t, "the leader to apply its log", func() bool { st := c.Node(lead).Status(); return st.Applied >= st.Commit })
		before := c.Node(lead).Status()
		badRawRound(t, ctx, cli, reqs, long)
		return before, c.Node(lead).Status()
	})
	if after.Commit != before.Commit {
		t.Errorf("bad raw requests reached the log: commit %d -> %d", before.Commit, after.Commit)
	}
	good, err := cli.Propose(ctx, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: sid, Seq: 1, Name: "fine", Try: true})
	if err != nil || good.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("the replica no longer serves a good acquire: %v %v", good, err)
	}
}

// badRawRound sends each of reqs through cli and expects CODE_INVALID,
// then reads (Holder, Observe) bad names and expects the same.
func badRawRound(t *testing.T, ctx context.Context, cli lockpb.LockClient, reqs []*lockpb.Request, long string) {
	t.Helper()
	for _, r := range reqs {
		resp, err := cli.Propose(ctx, r)
		if err != nil || resp.GetCode() != lockpb.Code_CODE_INVALID {
			t.Errorf("Propose(op %v name %q value %d bytes pending %d): %v %v, want CODE_INVALID", r.GetOp(), short(r.GetName()), len(r.GetValue()), len(r.GetPending()), resp.GetCode(), err)
		}
	}
	for _, name := range []string{"", long, "nul\x00byte", "\x00", "\x00" + long} {
		resp, err := cli.Holder(ctx, &lockpb.HolderRequest{Name: name})
		if err != nil || resp.GetCode() != lockpb.Code_CODE_INVALID {
			t.Errorf("Holder(%q): %v %v, want CODE_INVALID", short(name), resp.GetCode(), err)
		}
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := cli.Observe(octx, &lockpb.HolderRequest{Name: name})
		if err == nil {
			var r *lockpb.HolderResponse
			r, err = st.Recv()
			if err == nil && r.GetCode() != lockpb.Code_CODE_INVALID {
				t.Errorf("Observe(%q): first answer %v, want CODE_INVALID", short(name), r)
			}
		}
		cancel()
	}
}

// Invalid UTF-8 in a string field cannot be built with the generated code,
// but a foreign client can put it on the wire: the server must refuse the
// call (an error status) without a panic or a log entry, and go on serving.
func TestReviewPRawGRPCInvalidUTF8OnTheWire(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	lead := c.WaitLeader(5 * time.Second)
	n := c.Node(lead)
	cc, err := grpc.NewClient(n.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := testCtx(t, 20*time.Second)
	cli := dialLeader(t, n)
	open, err := cli.Propose(ctx, &lockpb.Request{Op: lockpb.Op_OP_OPEN_SESSION, TtlMs: 60_000})
	if err != nil || open.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("open: %v %v", open, err)
	}
	before := n.Status().Commit
	// The name field is appended by hand, with its field number from
	// lock.proto.
	nameField := fieldNumber(t, (&lockpb.Request{}).ProtoReflect().Descriptor().Fields().ByName("name").Number())
	req, _ := proto.Marshal(&lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: open.GetSession(), Seq: 1, Try: true})
	req = protowire.AppendTag(req, nameField, protowire.BytesType)
	req = protowire.AppendString(req, "bad\xffname")
	var resp lockpb.Response
	if err := cc.Invoke(ctx, lockpb.Lock_Propose_FullMethodName, &req, &resp); err == nil && resp.GetCode() != lockpb.Code_CODE_INVALID {
		t.Errorf("Propose with an invalid UTF-8 name: %v, want an error or CODE_INVALID", &resp)
	}
	hnameField := fieldNumber(t, (&lockpb.HolderRequest{}).ProtoReflect().Descriptor().Fields().ByName("name").Number())
	hreq := protowire.AppendString(protowire.AppendTag(nil, hnameField, protowire.BytesType), "bad\xffname")
	var hresp lockpb.HolderResponse
	if err := cc.Invoke(ctx, lockpb.Lock_Holder_FullMethodName, &hreq, &hresp); err == nil && hresp.GetCode() != lockpb.Code_CODE_INVALID {
		t.Errorf("Holder with an invalid UTF-8 name: %v, want an error or CODE_INVALID", &hresp)
	}
	if after := n.Status().Commit; after != before {
		t.Errorf("an invalid UTF-8 name reached the log: commit %d -> %d", before, after)
	}
	if closed(n.Done()) {
		t.Fatal("the replica stopped")
	}
	good, err := cli.Propose(ctx, &lockpb.Request{Op: lockpb.Op_OP_ACQUIRE, Session: open.GetSession(), Seq: 1, Name: "fine", Try: true})
	if err != nil || good.GetCode() != lockpb.Code_CODE_OK {
		t.Fatalf("the replica no longer serves a good acquire: %v %v", good, err)
	}
}

func fieldNumber(t *testing.T, n protowire.Number) protowire.Number {
	t.Helper()
	if n == 0 {
		t.Fatal("no such field")
	}
	return n
}

// seqs returns from, from+1, ..., to-1.
func seqs(from, to uint64) []uint64 {
	var out []uint64
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func short(s string) string {
	if len(s) > 20 {
		return s[:20] + "..."
	}
	return s
}
