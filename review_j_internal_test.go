package quorumlock

import "testing"

// A leader the client forgot (rotate: a call's ctx ended there) and then
// learned again (a follower's redirect, a heartbeat's answer) has not
// moved: the calls waiting at it are not aborted. Aborting them made each
// forget the leader again, so that a client's calls with short contexts
// kept its other calls bouncing off a healthy leader. A move to another
// address, and back, still ends them.
func TestReviewJSameLeaderLearnedAgainIsNoMove(t *testing.T) {
	c := &Client{addrs: []string{"a:1", "b:1", "c:1"}}
	c.setLeader("a:1")
	_, m := c.pickWatch() // a call waiting at a:1
	c.rotate("a:1")
	if got := c.pick(); got != "b:1" {
		t.Fatalf("after rotate, pick %q, want b:1", got)
	}
	c.setLeader("a:1")
	if isDone(m) {
		t.Fatal("learning the forgotten leader again aborted the calls waiting at it")
	}
	c.setLeader("a:1")
	if isDone(m) {
		t.Fatal("learning the same leader twice aborted the calls waiting at it")
	}
	c.setLeader("b:1")
	if !isDone(m) {
		t.Fatal("a move to another leader did not abort the calls waiting at the old one")
	}
	_, m = c.pickWatch() // a call waiting at b:1
	c.rotate("b:1")
	c.setLeader("a:1")
	if !isDone(m) {
		t.Fatal("a move back to an earlier leader did not abort the calls waiting at the last one")
	}
}
