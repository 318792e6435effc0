package quorumlock_test

// API review as a first-time user: each test here failed on the code it
// was written against.

import (
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testcluster"
)

// A nil option (an option chosen conditionally and left unset) is ignored
// by Dial and NewSession; both used to panic with a nil dereference.
func TestReviewAPINilOptionsIgnored(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	lead := c.WaitLeader(5 * time.Second)
	n := c.Node(lead)
	noPanic := func(what string, f func()) {
		t.Helper()
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("%s panicked: %v", what, r)
			}
		}()
		f()
	}
	noPanic("Node.NewSession(nil)", func() {
		s, err := n.NewSession(testCtx(t, 10*time.Second), nil, quorumlock.WithTTL(5*time.Second), nil)
		if err != nil {
			t.Fatalf("Node.NewSession with nil options: %v", err)
		}
		if s.TTL() != 5*time.Second {
			t.Errorf("TTL %v, want 5s (the non-nil option applies)", s.TTL())
		}
		s.Close(testCtx(t, 10*time.Second))
	})
	var cl *quorumlock.Client
	noPanic("Dial(nil)", func() {
		var err error
		cl, err = quorumlock.Dial(testCtx(t, 10*time.Second), []string{n.Addr().String()}, nil, quorumlock.WithSessionTTL(6*time.Second))
		if err != nil {
			t.Fatalf("Dial with a nil option: %v", err)
		}
	})
	defer cl.Close()
	noPanic("Client.NewSession(nil)", func() {
		s, err := cl.NewSession(testCtx(t, 10*time.Second), nil)
		if err != nil {
			t.Fatalf("Client.NewSession with a nil option: %v", err)
		}
		if s.TTL() != 6*time.Second {
			t.Errorf("TTL %v, want 6s (Dial's WithSessionTTL)", s.TTL())
		}
		s.Close(testCtx(t, 10*time.Second))
	})
}
