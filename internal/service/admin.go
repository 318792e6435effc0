package service

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
)

func pageLimit(l uint32) int {
	switch {
	case l == 0:
		return 100
	case l > 10_000:
		return 10_000
	}
	return int(l)
}

// maxPageBytes bounds the locks of one ListLocks page, well under gRPC's
// default 4 MiB receive limit: a lock can carry a 4 KiB value and
// thousands of waiters, so a page of 10,000 would not fit.
const maxPageBytes = lockpb.MaxBatchBytes

// ListLocks pages through held locks and roles in key order, as of a
// linearizable read. A page ends early, with more set, once its locks add
// up to maxPageBytes (it holds at least one).
func (s *Service) ListLocks(ctx context.Context, req *lockpb.ListRequest) (*lockpb.ListLocksResponse, error) {
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	after := req.GetAfterName()
	page, more := s.m.Locks(after, pageLimit(req.GetLimit()))
	resp := &lockpb.ListLocksResponse{More: more}
	size := 0
	for i, li := range page {
		st := &lockpb.LockState{Name: li.Name, Session: li.Holder, Token: li.Token, Waiters: li.Waiters, Value: li.Value}
		if len(li.Name) > 0 && li.Name[:len(fsm.RolePrefix)] == fsm.RolePrefix {
			st.Name, st.Role = li.Name[len(fsm.RolePrefix):], true
		}
		if size += proto.Size(st); i > 0 && size > maxPageBytes {
			resp.More = true
			break
		}
		resp.Locks = append(resp.Locks, st)
	}
	return resp, nil
}

// ListSessions pages through live sessions in ID order, as of a
// linearizable read.
func (s *Service) ListSessions(ctx context.Context, req *lockpb.ListRequest) (*lockpb.ListSessionsResponse, error) {
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	page, more := s.m.SessionsAfter(req.GetAfterId(), pageLimit(req.GetLimit()))
	resp := &lockpb.ListSessionsResponse{More: more}
	for _, si := range page {
		resp.Sessions = append(resp.Sessions, &lockpb.SessionState{
			Id:    si.ID,
			TtlMs: time.Duration(si.TTL).Milliseconds(),
			Held:  uint32(s.m.Held(si.ID)),
		})
	}
	return resp, nil
}
