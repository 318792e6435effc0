package quorumlock_test

import (
	"testing"
	"time"

	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// TestCloseHandsLeadershipOver: Close on the leader transfers leadership
// before it stops (Status at return names another leader, one term later),
// and the rest of the cluster serves at once with the lock table intact.
// HardClose does not: the stopped leader still names itself.
func TestCloseHandsLeadershipOver(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 3, SessionTTL: 30 * time.Second})
	lead := c.WaitLeader(10 * time.Second)
	term := c.Node(lead).Status().Term
	f := follower(c, lead)
	s := newSession(t, c.Node(f))
	la := mustAcquire(t, s, "a")

	n := c.Node(lead)
	c.Close(lead)
	st := n.Status()
	if st.Leader == lead || st.Leader == 0 || st.Term != term+1 {
		t.Fatalf("after Close the old leader's view is leader %d, term %d; want another leader in term %d", st.Leader, st.Term, term+1)
	}
	if got := c.WaitLeader(10 * time.Second); got != st.Leader {
		t.Fatalf("the cluster's leader is %d; the old leader handed over to %d", got, st.Leader)
	}
	lb := mustAcquire(t, s, "b")
	if lb.Token() <= la.Token() {
		t.Fatalf("token %d after the hand-over is not above %d", lb.Token(), la.Token())
	}
	if info := holder(t, c.Node(f), "a"); info.Holder != s.ID() || info.Token != la.Token() {
		t.Fatalf("lock a after the hand-over: %+v; want held by %d with token %d", info, s.ID(), la.Token())
	}

	// HardClose: no hand-over.
	lead2 := st.Leader
	n2 := c.Node(lead2)
	c.Stop(lead2)
	if st := n2.Status(); st.Leader != lead2 {
		t.Fatalf("after HardClose the leader's last view names leader %d; want itself (%d)", st.Leader, lead2)
	}
}
