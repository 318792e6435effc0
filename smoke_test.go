package quorumlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/testcluster"
)

func TestSmoke(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Verbose: false})
	lead := c.WaitLeader(5 * time.Second)
	t.Logf("leader %d", lead)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, id := range c.IDs() {
		s, err := c.Node(id).NewSession(ctx)
		if err != nil {
			t.Fatalf("session on %d: %v", id, err)
		}
		l, err := s.Acquire(ctx, "a")
		if err != nil {
			t.Fatalf("acquire on %d: %v", id, err)
		}
		t.Logf("node %d session %d token %d", id, s.ID(), l.Token())
		info, err := c.Node(id).Holder(ctx, "a")
		if err != nil || info.Holder != s.ID() {
			t.Fatalf("holder %+v %v", info, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
