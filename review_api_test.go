package quorumlock_test

// API review as a first-time user: each test here failed on the code it
// was written against.

import (
	"errors"
	"strings"
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

// A cluster configured with MaxNameBytes above the default 256 accepts
// longer names from a remote Client as it does from a replica's sessions;
// the Client used to refuse every name over 256 bytes locally. A name over
// the cluster's bound is still refused with ErrInvalidName, by the cluster.
func TestReviewAPIClientNameBoundIsTheCluster(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1, Configure: func(cfg *quorumlock.Config) { cfg.MaxNameBytes = 600 }})
	lead := c.WaitLeader(5 * time.Second)
	cl := dial(t, addrsOf(c, c.IDs()...))
	s, err := cl.NewSession(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(testCtx(t, 10*time.Second))
	long := strings.Repeat("n", 500)
	l, err := s.Acquire(testCtx(t, 10*time.Second), long)
	if err != nil {
		t.Fatalf("client Acquire of a 500-byte name (cluster MaxNameBytes 600): %v", err)
	}
	info, err := cl.Holder(testCtx(t, 10*time.Second), long)
	if err != nil || info.Holder != s.ID() || info.Token != l.Token() {
		t.Fatalf("client Holder of the 500-byte name: %+v, %v", info, err)
	}
	if got := holder(t, c.Node(lead), long); got.Holder != s.ID() {
		t.Fatalf("replica Holder: %+v", got)
	}
	ld, err := s.Elect(testCtx(t, 10*time.Second), long, nil)
	if err != nil {
		t.Fatalf("client Elect of a 500-byte role: %v", err)
	}
	if li, err := cl.Leader(testCtx(t, 10*time.Second), long); err != nil || li.Epoch != ld.Epoch() {
		t.Fatalf("client Leader of the 500-byte role: %+v, %v", li, err)
	}
	tooLong := strings.Repeat("n", 601)
	if _, err := s.TryAcquire(testCtx(t, 10*time.Second), tooLong); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("TryAcquire of a name over the cluster's bound: %v, want ErrInvalidName", err)
	}
	if _, err := cl.Holder(testCtx(t, 10*time.Second), tooLong); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("Holder of a name over the cluster's bound: %v, want ErrInvalidName", err)
	}
	if _, err := s.Elect(testCtx(t, 10*time.Second), tooLong, nil); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("Elect of a role over the cluster's bound: %v, want ErrInvalidName", err)
	}
	if _, err := s.TryAcquire(testCtx(t, 10*time.Second), strings.Repeat("n", quorumlock.MaxNameBytesLimit+1)); !errors.Is(err, quorumlock.ErrInvalidName) {
		t.Errorf("TryAcquire of a name over MaxNameBytesLimit: %v, want ErrInvalidName", err)
	}
}

// Config.MaxNameBytes is bounded by MaxNameBytesLimit, the longest name a
// Client sends.
func TestReviewAPIMaxNameBytesBounded(t *testing.T) {
	cfg := quorumlock.Config{ID: 1, Peers: map[uint64]string{1: "127.0.0.1:1"}, DataDir: t.TempDir(), MaxNameBytes: quorumlock.MaxNameBytesLimit + 1}
	n, err := quorumlock.Start(testCtx(t, 10*time.Second), cfg)
	if err == nil {
		n.Close()
	}
	if !errors.Is(err, quorumlock.ErrInvalidConfig) {
		t.Fatalf("Start with MaxNameBytes %d: %v, want ErrInvalidConfig", cfg.MaxNameBytes, err)
	}
}

// Proclaim after Resign is refused with ErrNotHeld, as documented, also
// for a leadership of Node.Elect (whose Resign closes its session: it used
// to return ErrSessionExpired "closed"). Errors about a role name it, not
// the internal key of its lock (a second Resign said "lock not held:
// \"\x00svc\"").
func TestReviewAPIProclaimAfterNodeElectResign(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Size: 1})
	n := c.Node(c.WaitLeader(5 * time.Second))
	ld, err := n.Elect(testCtx(t, 10*time.Second), "svc", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ld.Resign(testCtx(t, 10*time.Second)); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	if err := ld.Proclaim(testCtx(t, 10*time.Second), []byte("w")); !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Errorf("Proclaim after Resign of a Node.Elect leadership: %v, want ErrNotHeld", err)
	}

	s := newSession(t, n)
	ld, err = s.Elect(testCtx(t, 10*time.Second), "svc", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ld.Resign(testCtx(t, 10*time.Second)); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	err = ld.Resign(testCtx(t, 10*time.Second))
	if !errors.Is(err, quorumlock.ErrNotHeld) {
		t.Fatalf("second Resign: %v, want ErrNotHeld", err)
	}
	if strings.Contains(err.Error(), "\x00") || !strings.Contains(err.Error(), `role "svc"`) {
		t.Errorf("second Resign's error %q does not name the role", err)
	}
}
