package quorumlock

// Review P: the mapping of the cluster's refusals to sentinels. The
// library's own checks normally refuse such input before it is sent, so
// only a cluster that refuses what the client accepted (another version, a
// foreign server) reaches these paths: a backend here answers one op with
// a chosen code.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// refusingBackend passes requests to a real replica's router, except that
// it answers requests of op with code once armed.
type refusingBackend struct {
	backend

	mu   sync.Mutex
	op   lockpb.Op
	code lockpb.Code
}

func (r *refusingBackend) arm(op lockpb.Op, code lockpb.Code) {
	r.mu.Lock()
	r.op, r.code = op, code
	r.mu.Unlock()
}

func (r *refusingBackend) propose(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
	r.mu.Lock()
	op, code := r.op, r.code
	r.mu.Unlock()
	if code != lockpb.Code_CODE_OK && req.GetOp() == op {
		return &lockpb.Response{Code: code}, nil
	}
	return r.backend.propose(ctx, req)
}

// Each refusal maps to the sentinel its call documents: an open refused as
// invalid is ErrInvalidTTL, as over a limit ErrLimit; a proclaim refused as
// invalid is ErrLimit (its value); an acquire refused as invalid is
// ErrInvalidName, over a limit ErrLimit; a release over a limit is ErrLimit
// wrapped with ErrUnknownOutcome.
func TestReviewPClusterRefusalsMapToSentinels(t *testing.T) {
	n, _ := startOne(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rb := &refusingBackend{backend: n.router}
	open := func() (*Session, error) {
		return openSession(ctx, rb, newOpenCalls(), n.hb, n.cfg.Clock, 3*time.Second, n.cfg.MaxNameBytes)
	}

	rb.arm(lockpb.Op_OP_OPEN_SESSION, lockpb.Code_CODE_INVALID)
	if _, err := open(); !errors.Is(err, ErrInvalidTTL) {
		t.Errorf("open refused CODE_INVALID: %v, want ErrInvalidTTL", err)
	}
	rb.arm(lockpb.Op_OP_OPEN_SESSION, lockpb.Code_CODE_LIMIT)
	if _, err := open(); !errors.Is(err, ErrLimit) {
		t.Errorf("open refused CODE_LIMIT: %v, want ErrLimit", err)
	}
	rb.arm(0, lockpb.Code_CODE_OK)
	s, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())

	rb.arm(lockpb.Op_OP_ACQUIRE, lockpb.Code_CODE_INVALID)
	if _, err := s.TryAcquire(ctx, "a"); !errors.Is(err, ErrInvalidName) {
		t.Errorf("acquire refused CODE_INVALID: %v, want ErrInvalidName", err)
	}
	rb.arm(lockpb.Op_OP_ACQUIRE, lockpb.Code_CODE_LIMIT)
	if _, err := s.TryAcquire(ctx, "b"); !errors.Is(err, ErrLimit) {
		t.Errorf("acquire refused CODE_LIMIT: %v, want ErrLimit", err)
	}
	rb.arm(0, lockpb.Code_CODE_OK)
	l, err := s.TryAcquire(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	rb.arm(lockpb.Op_OP_RELEASE, lockpb.Code_CODE_LIMIT)
	if err := l.Release(ctx); !errors.Is(err, ErrLimit) || !errors.Is(err, ErrUnknownOutcome) {
		t.Errorf("release refused CODE_LIMIT: %v, want ErrLimit and ErrUnknownOutcome", err)
	}
	rb.arm(0, lockpb.Code_CODE_OK)
	ld, err := s.Elect(ctx, "role", []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}
	rb.arm(lockpb.Op_OP_PROCLAIM, lockpb.Code_CODE_INVALID)
	if err := ld.Proclaim(ctx, []byte("v2")); !errors.Is(err, ErrLimit) {
		t.Errorf("proclaim refused CODE_INVALID: %v, want ErrLimit", err)
	}
	rb.arm(lockpb.Op_OP_PROCLAIM, lockpb.Code_CODE_LIMIT)
	if err := ld.Proclaim(ctx, []byte("v3")); !errors.Is(err, ErrLimit) || !errors.Is(err, ErrUnknownOutcome) {
		t.Errorf("proclaim refused CODE_LIMIT: %v, want ErrLimit and ErrUnknownOutcome", err)
	}
	rb.arm(0, lockpb.Code_CODE_OK)
	if closed := func() bool {
		select {
		case <-s.Done():
			return true
		default:
			return false
		}
	}(); closed {
		t.Error("the refusals ended the session")
	}
}
