package quorumlock

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// Operator calls: what lockctl uses. They go through the client API, so
// they work from any process.

// ReplicaStatus is one replica's view, as Status reports it, or the error of
// asking it.
type ReplicaStatus struct {
	Addr string // the address as given to Dial
	Status
	// Err is nil when the replica answered; otherwise why not: ErrClosed
	// after Client.Close, or the error of connecting or of the call (a
	// gRPC status error: codes.DeadlineExceeded when ctx's deadline passed
	// first, codes.Canceled when ctx was cancelled first).
	Err error
}

// Status asks every replica the client knows for its view (its ID, leader,
// term, commit and applied indexes), each within ctx, and returns one
// entry per address given to Dial, in that order.
func (c *Client) Status(ctx context.Context) []ReplicaStatus {
	if c.nilClient() {
		return nil
	}
	ctx = orBackground(ctx)
	out := make([]ReplicaStatus, len(c.addrs))
	if c.isClosed() {
		for i, addr := range c.addrs {
			out[i] = ReplicaStatus{Addr: addr, Err: ErrClosed}
		}
		return out
	}
	done := make(chan struct{}, len(c.addrs))
	for i, addr := range c.addrs {
		go func() {
			defer func() { done <- struct{}{} }()
			out[i].Addr = addr
			cc, err := c.conn(addr)
			if err != nil {
				out[i].Err = err
				return
			}
			r, err := lockpb.NewLockClient(cc).Status(ctx, &lockpb.StatusRequest{})
			if err != nil {
				out[i].Err = err
				return
			}
			out[i].Status = Status{ID: r.GetId(), Leader: r.GetLeader(), Term: r.GetTerm(), Commit: r.GetCommit(), Applied: r.GetApplied()}
		}()
	}
	for range c.addrs {
		<-done
	}
	return out
}

// LockEntry is one held lock or role in a listing.
type LockEntry struct {
	LockInfo
	Role  bool   // Name is a leader-election role
	Value []byte // a role's value
	// Cursor is the entry's position in the listing: pass the last
	// entry's Cursor to Locks to continue after it. (Roles and locks share
	// one ordering, roles first, so a bare name is not enough.)
	Cursor string
}

// Locks lists held locks and roles after the cursor after ("" for the
// start; roles sort first), at most limit (0 or less: 100; above 10,000:
// 10,000), as of a linearizable read, and reports whether more follow:
// pass the last entry's Cursor as after to continue. A page may hold fewer
// entries than limit with more set: the replica ends it once its entries
// add up to about 1 MiB (locks with long queues or large values). A cursor
// that is not valid UTF-8 (no key is) fails with ErrInvalidName. Other
// errors: ErrClosed, ctx's error.
func (c *Client) Locks(ctx context.Context, after string, limit int) ([]LockEntry, bool, error) {
	if c.nilClient() {
		return nil, false, errNoClient
	}
	ctx = orBackground(ctx)
	if !utf8.ValidString(after) {
		// It cannot be marshaled into the request: every attempt would
		// fail the same way until ctx ends.
		return nil, false, fmt.Errorf("%w: cursor %q is not valid UTF-8", ErrInvalidName, after)
	}
	var out []LockEntry
	var more bool
	err := c.read(ctx, func(actx context.Context, cli lockpb.LockClient) error {
		r, err := cli.ListLocks(actx, &lockpb.ListRequest{AfterName: after, Limit: wireLimit(limit)})
		if err != nil {
			return err
		}
		out, more = nil, r.GetMore()
		for _, l := range r.GetLocks() {
			out = append(out, LockEntry{
				LockInfo: LockInfo{Name: l.GetName(), Holder: l.GetSession(), Token: Token(l.GetToken()), Waiters: l.GetWaiters()},
				Role:     l.GetRole(),
				Value:    l.GetValue(),
				Cursor:   l.GetName(),
			})
			if l.GetRole() {
				out[len(out)-1].Cursor = roleKey(l.GetName())
			}
		}
		return nil
	})
	return out, more, err
}

// SessionEntry is one live session in a listing.
type SessionEntry struct {
	ID   uint64
	TTL  time.Duration // in whole milliseconds, as the cluster keeps it
	Held int           // locks and roles it holds
}

// Sessions lists live sessions with IDs above after, in ID order, at most
// limit (0 or less: 100; above 10,000: 10,000), as of a linearizable read,
// and reports whether more follow: pass the last entry's ID as after to
// continue. Errors: ErrClosed, ctx's error.
func (c *Client) Sessions(ctx context.Context, after uint64, limit int) ([]SessionEntry, bool, error) {
	if c.nilClient() {
		return nil, false, errNoClient
	}
	ctx = orBackground(ctx)
	var out []SessionEntry
	var more bool
	err := c.read(ctx, func(actx context.Context, cli lockpb.LockClient) error {
		r, err := cli.ListSessions(actx, &lockpb.ListRequest{AfterId: after, Limit: wireLimit(limit)})
		if err != nil {
			return err
		}
		out, more = nil, r.GetMore()
		for _, s := range r.GetSessions() {
			out = append(out, SessionEntry{ID: s.GetId(), TTL: time.Duration(s.GetTtlMs()) * time.Millisecond, Held: int(s.GetHeld())})
		}
		return nil
	})
	return out, more, err
}

// maxListLimit is the largest page the replicas serve.
const maxListLimit = 10_000

// wireLimit is a page size as the request carries it: 0 for the replica's
// default, and at most maxListLimit, so that a limit past 2^32 does not
// wrap around to a small page (1<<32 became 0: 100 entries).
func wireLimit(limit int) uint32 {
	return uint32(min(max(limit, 0), maxListLimit))
}

func (c *Client) read(ctx context.Context, f func(context.Context, lockpb.LockClient) error) error {
	if c.isClosed() {
		return ErrClosed
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	err := c.retry(ctx, func(actx context.Context, cc *grpc.ClientConn) (bool, error) {
		err := f(actx, lockpb.NewLockClient(cc))
		return err == nil, err
	})
	return c.ctxErr(ctx, err)
}

// RevokeSession ends a session by force, through the log: its locks go to
// their next waiters with larger tokens, and its holder learns at its next
// heartbeat. For operators recovering from a stuck holder; the holder's own
// view of time is not consulted, so use it only when the holder is known to
// be gone or the resource is fenced. Errors: ErrSessionExpired if no such
// session is live, ErrClosed, ctx's error.
//
// A revoke carries no (session, seq) of its own, so a retry is a new
// command: when an attempt whose answer was lost may have revoked the
// session (it was sent, perhaps into a connection that had just died) and
// the retry finds it gone, RevokeSession returns nil, not
// ErrSessionExpired: the session is gone either way, but nil then does not
// prove that this call revoked it.
func (c *Client) RevokeSession(ctx context.Context, id uint64) error {
	if c.nilClient() {
		return errNoClient
	}
	ctx = orBackground(ctx)
	if c.isClosed() {
		return ErrClosed
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	resp, uncertain, err := c.proposeTracked(ctx, &lockpb.Request{Op: lockpb.Op_OP_REVOKE, Session: id})
	if err != nil {
		return c.ctxErr(ctx, err)
	}
	switch resp.GetCode() {
	case lockpb.Code_CODE_OK:
		return nil
	case lockpb.Code_CODE_NO_SESSION:
		if uncertain {
			return nil
		}
		return fmt.Errorf("%w: no live session %d", ErrSessionExpired, id)
	}
	return fmt.Errorf("quorumlock: revoke %d: %s", id, resp.GetCode())
}
