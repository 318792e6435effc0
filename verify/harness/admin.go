package harness

import (
	"context"
	"errors"
	"time"

	"github.com/quorumlock/quorumlock"
)

// What Cluster and Procs do the same way through the public API.

// liveSessions lists the cluster's live sessions through admin, paging
// 1,000 at a time (at most 100 pages), leaving out those isProbe reports
// as the harness's own probe sessions.
func liveSessions(ctx context.Context, admin *quorumlock.Client, isProbe func(id uint64) bool) (map[uint64]bool, error) {
	out := make(map[uint64]bool)
	var after uint64
	for range 100 {
		ss, more, err := admin.Sessions(ctx, after, 1000)
		if err != nil {
			return nil, err
		}
		for _, s := range ss {
			if !isProbe(s.ID) {
				out[s.ID] = true
			}
			after = s.ID
		}
		if !more {
			return out, nil
		}
	}
	return out, errors.New("too many sessions")
}

// readHolder is a linearizable read of name's holder, token and waiters.
func readHolder(ctx context.Context, admin *quorumlock.Client, name string) (Info, error) {
	li, err := admin.Holder(ctx, name)
	return Info{Holder: li.Holder, Token: uint64(li.Token), Waiters: li.Waiters}, err
}

// tryThenRelease is a probe: TryAcquire of name by s, then its release
// in the background (bounded by a second).
func tryThenRelease(ctx context.Context, s *quorumlock.Session, name string) error {
	l, err := s.TryAcquire(ctx, name)
	if err != nil {
		return err
	}
	go func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		l.Release(rctx)
	}()
	return nil
}
