package service

import (
	"context"
	"slices"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// maxWatchBacklog bounds the changes kept for a slow watcher; past it the
// oldest are dropped (the watcher still sees the latest state).
const maxWatchBacklog = 1024

// watcher follows one lock on this replica's applied state.
type watcher struct {
	key     string
	last    fsm.LockInfo
	backlog []fsm.LockInfo
	wake    chan struct{} // 1-buffered: something was queued
}

// Watch streams the state of the lock key as this replica applies changes:
// first the state after a linearizable read (ReadIndex then apply), then
// every change of holder, token or value, in log order. A slow receiver
// loses intermediate states beyond maxWatchBacklog, never the latest. The
// channel closes when ctx ends or the service stops; if the linearizable
// read fails (ctx ended), it closes without a value.
func (s *Service) Watch(ctx context.Context, key string) <-chan fsm.LockInfo {
	out := make(chan fsm.LockInfo)
	go func() {
		defer close(out)
		if err := s.linearize(ctx); err != nil {
			return
		}
		w := &watcher{key: key, wake: make(chan struct{}, 1)}
		s.mu.Lock()
		w.last = s.m.Holder(key)
		w.backlog = append(w.backlog, w.last)
		s.watchers[key] = append(s.watchers[key], w)
		s.mu.Unlock()
		w.wake <- struct{}{}
		defer func() {
			s.mu.Lock()
			s.watchers[key] = slices.DeleteFunc(s.watchers[key], func(x *watcher) bool { return x == w })
			if len(s.watchers[key]) == 0 {
				delete(s.watchers, key)
			}
			s.mu.Unlock()
		}()
		for {
			select {
			case <-w.wake:
			case <-ctx.Done():
				return
			case <-s.stopc:
				return
			}
			s.mu.Lock()
			batch := w.backlog
			w.backlog = nil
			s.mu.Unlock()
			for _, li := range batch {
				select {
				case out <- li:
				case <-ctx.Done():
					return
				case <-s.stopc:
					return
				}
			}
		}
	}()
	return out
}

// notifyWatchers queues the new state of every watched lock that changed.
// Called with s.mu held, after applying entries.
func (s *Service) notifyWatchers() {
	for key, ws := range s.watchers {
		notifyKey(s.m.Holder(key), ws)
	}
}

// notifyApplied is notifyWatchers after one applied command: a command
// that names one lock (acquire, release, withdraw, proclaim) changes at
// most that lock (a release's hand-off goes to a waiter of the same
// lock), and opening a session changes none, so only the others (a
// session's close, expiry or revocation, which free every lock it held)
// look at every watched lock. With thousands of observed names, a lookup
// per name on every applied entry made an acquire+release cycle about 4x
// slower (found by a review).
func (s *Service) notifyApplied(cmd *fsm.Command) {
	switch cmd.Op {
	case fsm.OpOpenSession:
	case fsm.OpAcquire, fsm.OpRelease, fsm.OpWithdraw, fsm.OpProclaim:
		if ws, ok := s.watchers[cmd.Name]; ok {
			notifyKey(s.m.Holder(cmd.Name), ws)
		}
	default:
		s.notifyWatchers()
	}
}

// notifyKey queues li, the state of one lock, for its watchers ws that
// have not seen it.
func notifyKey(li fsm.LockInfo, ws []*watcher) {
	for _, w := range ws {
		if sameGrant(w.last, li) {
			continue
		}
		w.last = li
		if len(w.backlog) >= maxWatchBacklog {
			w.backlog = w.backlog[1:]
		}
		w.backlog = append(w.backlog, li)
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

func sameGrant(a, b fsm.LockInfo) bool {
	return a.Holder == b.Holder && a.Token == b.Token && string(a.Value) == string(b.Value)
}

// Observe is the gRPC form of Watch.
func (s *Service) Observe(req *lockpb.HolderRequest, stream lockpb.Lock_ObserveServer) error {
	if ok, err := s.Readable(stream.Context(), req.GetName()); err != nil {
		return err
	} else if !ok {
		return stream.Send(&lockpb.HolderResponse{Code: lockpb.Code_CODE_INVALID, Message: s.nameRule()})
	}
	for li := range s.Watch(stream.Context(), req.GetName()) {
		if err := stream.Send(holderResponse(li)); err != nil {
			return err
		}
	}
	return stream.Context().Err()
}
