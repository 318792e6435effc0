package quorumlock_test

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
)

// A replica serving on a unix socket (Config.Listener) and a Client that
// dials it with a "unix:///path" target, as Dial's doc allows: sessions
// heartbeat over it (a 1 s session lives through 3 s) and locks work.
func TestReviewAAUnixSocketClient(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sock := filepath.Join(dir, "q.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	n, err := quorumlock.Start(testCtx(t, 10*time.Second), quorumlock.Config{ID: 1, Peers: map[uint64]string{1: "127.0.0.1:0"}, DataDir: filepath.Join(dir, "d"), Listener: lis, TickInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := testCtx(t, 20*time.Second)
	cl, err := quorumlock.Dial(ctx, []string{"unix://" + sock}, quorumlock.WithElectionTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s, err := cl.NewSession(ctx, quorumlock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if closed(l.Lost()) {
		t.Fatalf("a 1 s session over a unix socket lost its lock: %v", s.Err())
	}
	if info, err := cl.Holder(ctx, "x"); err != nil || info.Holder != s.ID() || info.Token != l.Token() {
		t.Fatalf("Holder through the unix socket: %+v, %v", info, err)
	}
	if st := cl.Status(ctx); len(st) != 1 || st[0].Err != nil || st[0].ID != 1 || st[0].Leader != 1 {
		t.Fatalf("Status through the unix socket: %+v", st)
	}
}
