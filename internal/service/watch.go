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
		li := s.m.Holder(key)
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
}

func sameGrant(a, b fsm.LockInfo) bool {
	return a.Holder == b.Holder && a.Token == b.Token && string(a.Value) == string(b.Value)
}

// Observe is the gRPC form of Watch.
func (s *Service) Observe(req *lockpb.HolderRequest, stream lockpb.Lock_ObserveServer) error {
	if !fsm.ValidKey(req.GetName(), s.lim.MaxNameBytes) {
		return stream.Send(&lockpb.HolderResponse{Code: lockpb.Code_CODE_INVALID, Message: "invalid lock name"})
	}
	for li := range s.Watch(stream.Context(), req.GetName()) {
		if err := stream.Send(holderResponse(li)); err != nil {
			return err
		}
	}
	return stream.Context().Err()
}
