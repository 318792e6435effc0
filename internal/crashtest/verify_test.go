package crashtest

import (
	"context"

	"github.com/quorumlock/quorumlock/internal/lockpb"
)

// verify stops the workload, waits until every replica has applied all
// that was committed, and checks every replica against what the clients
// were told, the grant history, and the recorders. It returns the commit
// index the replicas reached.
func (w *workload) verify() uint64 {
	c := w.c
	c.t.Helper()
	w.stop()
	for _, e := range w.h.anomalies() {
		c.t.Errorf("acknowledged outcome contradicted: %s", e)
	}
	for _, e := range w.h.check() {
		c.t.Errorf("grant history: %s", e)
	}
	commit := c.quiesce()

	// What the clients hold, by their acknowledged answers.
	want := make(map[string]*grant)
	sessions := make(map[uint64]bool)
	for _, cl := range w.client {
		sessions[cl.session] = true
		if cl.state == holding {
			want[cl.name] = cl.cur
		}
	}
	for _, l := range c.running() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		locks, err := l.svc.ListLocks(ctx, &lockpb.ListRequest{Limit: pageOfLocks})
		if err != nil {
			cancel()
			c.t.Fatalf("replica %d: ListLocks: %v", l.rep.id, err)
		}
		ss, err := l.svc.ListSessions(ctx, &lockpb.ListRequest{Limit: pageOfLocks})
		cancel()
		if err != nil {
			c.t.Fatalf("replica %d: ListSessions: %v", l.rep.id, err)
		}
		got := make(map[string]bool)
		for _, ls := range locks.GetLocks() {
			got[ls.GetName()] = true
			g, ok := want[ls.GetName()]
			switch {
			case !ok:
				c.t.Errorf("replica %d: %q is held by session %d with token %d, but its acknowledged history ends released",
					l.rep.id, ls.GetName(), ls.GetSession(), ls.GetToken())
			case ls.GetSession() != g.session || ls.GetToken() != g.token:
				c.t.Errorf("replica %d: %q is held by session %d with token %d, acknowledged to session %d with token %d",
					l.rep.id, ls.GetName(), ls.GetSession(), ls.GetToken(), g.session, g.token)
			}
			if len(ls.GetWaiters()) > 0 {
				c.t.Errorf("replica %d: %q has waiters %v after every waiter withdrew", l.rep.id, ls.GetName(), ls.GetWaiters())
			}
		}
		for name, g := range want {
			if !got[name] {
				c.t.Errorf("replica %d: acknowledged grant of %q to session %d with token %d is lost", l.rep.id, name, g.session, g.token)
			}
		}
		live := make(map[uint64]bool)
		for _, s := range ss.GetSessions() {
			live[s.GetId()] = true
		}
		for id := range sessions {
			if !live[id] {
				c.t.Errorf("replica %d: acknowledged session %d is lost", l.rep.id, id)
			}
		}
	}
	for _, p := range c.problems() {
		c.t.Errorf("%s", p)
	}
	return commit
}

// grantCount returns the number of grants clients learned.
func (w *workload) grantCount() int {
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	return len(w.h.grants)
}
