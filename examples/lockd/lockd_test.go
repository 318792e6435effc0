package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/proctest"
)

// lockdBin is the lockd binary TestMain builds.
var lockdBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lockd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	const pkg = "github.com/quorumlock/quorumlock/examples/lockd"
	bins, err := proctest.Build(dir, pkg)
	if err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lockdBin = bins[pkg]
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func newCluster(t *testing.T, opts proctest.Options) *proctest.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts lockd processes")
	}
	return proctest.NewCluster(t, lockdBin, opts)
}

func dial(t *testing.T, c *proctest.Cluster, addrs []string) *quorumlock.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := quorumlock.Dial(ctx, addrs, c.ClientOptions()...)
	if err != nil {
		t.Fatalf("Dial %v: %v", addrs, err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// The scenario of the remote-client issue, with real processes: remote
// clients contend for one lock guarding a fenced resource while the leader
// is killed with SIGKILL and restarted, and then the new leader is paused
// with SIGSTOP for longer than the session TTL. No two clients ever write
// at once, the fence accepts every holder whose lease is current, grants
// come with strictly increasing tokens, and every client keeps acquiring:
// across each fault, and after the faults end.
func TestProcessFaults(t *testing.T) {
	c := newCluster(t, proctest.Options{})
	ttl := c.Options().TTL
	lead := c.WaitLeader(10 * time.Second)
	t.Logf("leader: %d", lead)

	r := &resource{fence: quorumlock.NewFence()}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	const clients = 4
	ws := make([]*worker, clients)
	for i := range ws {
		ws[i] = &worker{id: uint64(i + 1), cl: dial(t, c, c.Addrs()), r: r, log: t.Logf}
		wg.Go(func() { ws[i].run(ctx) })
	}
	t.Cleanup(func() { stop(); wg.Wait() })

	// progress waits until every client has completed an acquire after
	// now, or fails naming the phase.
	progress := func(phase string, within time.Duration) {
		t.Helper()
		base := make([]int64, clients)
		for i, w := range ws {
			base[i] = w.done.Load()
		}
		start := time.Now()
		deadline := start.Add(within)
		for i, w := range ws {
			for w.done.Load() <= base[i] {
				if time.Now().After(deadline) {
					t.Fatalf("%s: client %d made no progress in %v (last error: %v)", phase, w.id, within, w.lastErr())
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		t.Logf("%s: every client acquired within %v", phase, time.Since(start).Round(time.Millisecond))
	}

	progress("before the faults", 10*time.Second)

	// 1. SIGKILL the leader; the others elect a new one and serve.
	c.Kill(lead)
	t.Logf("killed %d", lead)
	next := c.WaitLeader(10 * time.Second)
	t.Logf("new leader: %d", next)
	progress("leader killed", 10*time.Second)

	// 2. Restart it on its port and data directory; it catches up.
	c.Start(lead)
	commit := c.Status(time.Second)[next].Commit
	c.WaitCaughtUp(lead, commit, 10*time.Second)
	t.Logf("restarted %d, caught up to %d", lead, commit)

	// 3. SIGSTOP the new leader for longer than the TTL. Its sockets stay
	// open: the clients must notice the silence, not a reset. The other
	// two elect a leader, and the clients move to it.
	c.Pause(next)
	t.Logf("paused %d", next)
	pauseEnds := time.Now().Add(2*ttl + time.Second)
	progress("leader paused", time.Until(pauseEnds))
	time.Sleep(time.Until(pauseEnds))
	c.Resume(next)
	t.Logf("resumed %d", next)

	// 4. After the faults every client still makes progress.
	progress("after the faults", 15*time.Second)
	stop()
	wg.Wait()

	if v := r.violations(); len(v) > 0 {
		for _, s := range v {
			t.Error(s)
		}
	}
	var total, errs int64
	for _, w := range ws {
		total += w.done.Load()
		errs += w.errs.Load()
	}
	t.Logf("%d grants, %d writes admitted, highest token %d, %d failed attempts (expected during faults)",
		total, r.writes.Load(), r.fence.Highest(resourceName), errs)
}

// A remote Acquire waiting at the leader when the leader is paused
// (SIGSTOP) moves to the new leader and learns of its grant about as fast
// as the cluster fails over: gRPC keepalive alone would take 10-20 s, so
// the client re-sends a waiting request as soon as its heartbeats find
// another leader.
func TestBlockedAcquireLeavesPausedLeader(t *testing.T) {
	c := newCluster(t, proctest.Options{})
	lead := c.WaitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	holder, err := dial(t, c, c.Addrs()).NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hl, err := holder.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	wcl := dial(t, c, c.Addrs())
	waiter, err := wcl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan time.Time, 1)
	go func() {
		if _, err := waiter.Acquire(ctx, "x"); err == nil {
			granted <- time.Now()
		}
	}()
	for {
		info, err := wcl.Holder(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Waiters) == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.Pause(lead)
	paused := time.Now()
	t.Cleanup(func() { c.Resume(lead) })
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	t.Logf("leader %d paused; holder released through the new leader after %v", lead, released.Sub(paused).Round(time.Millisecond))
	select {
	case at := <-granted:
		t.Logf("waiter learned of its grant %v after the release", at.Sub(released).Round(time.Millisecond))
	case <-time.After(3 * time.Second):
		info, _ := wcl.Holder(ctx, "x")
		at := <-granted
		t.Fatalf("waiter (session %d) not told of its grant within 3s of the release (cluster: holder %d, token %d); told after %v, %v after the pause",
			waiter.ID(), info.Holder, info.Token, at.Sub(released).Round(time.Millisecond), at.Sub(paused).Round(time.Millisecond))
	}
}

const (
	resourceName   = "resource"
	acquireTimeout = 2 * time.Second
)

// resource is the protected resource: a fence, and a holder slot that
// catches two clients writing at the same time.
type resource struct {
	fence  *quorumlock.Fence
	slot   atomic.Uint64 // ID of the client writing; 0 when none
	writes atomic.Int64

	mu   sync.Mutex
	errs []string
}

func (r *resource) violation(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *resource) violations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errs...)
}

// worker is one remote client in a loop: session, acquire, fenced writes,
// release.
type worker struct {
	id  uint64
	cl  *quorumlock.Client
	r   *resource
	log func(string, ...any)

	done atomic.Int64 // completed grants
	errs atomic.Int64 // failed attempts

	mu        sync.Mutex
	err       error
	lastToken quorumlock.Token // of this worker's last grant
}

func (w *worker) fail(err error) {
	w.errs.Add(1)
	w.mu.Lock()
	w.err = err
	w.mu.Unlock()
}

func (w *worker) lastErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *worker) run(ctx context.Context) {
	var s *quorumlock.Session
	defer func() {
		if s != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			s.Close(cctx)
			cancel()
		}
	}()
	for ctx.Err() == nil {
		if s == nil || s.Err() != nil {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ns, err := w.cl.NewSession(sctx)
			cancel()
			if err != nil {
				w.fail(fmt.Errorf("NewSession: %w", err))
				time.Sleep(20 * time.Millisecond)
				continue
			}
			s = ns
		}
		// Bounded: a waiting Acquire whose leader is paused learns of its
		// grant only when its ctx ends and it settles the outcome with the
		// new leader (see TestBlockedAcquireLeavesPausedLeader).
		actx, cancel := context.WithTimeout(ctx, acquireTimeout)
		l, err := s.Acquire(actx, resourceName)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.fail(fmt.Errorf("Acquire: %w", err))
			}
			continue
		}
		w.hold(l)
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = l.Release(rctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			// Lost meanwhile (ErrNotHeld, ErrSessionExpired), or unknown:
			// the next Acquire on a live session returns the same grant.
			w.fail(fmt.Errorf("Release: %w", err))
		}
		w.done.Add(1)
	}
}

// hold writes a few times under the lock. Each write is made only while
// the client believes it holds the lock (Lost not closed and the lease
// deadline not passed, checked on the clock); the slot check and the fence
// must then both agree.
func (w *worker) hold(l *quorumlock.Lock) {
	r, tok := w.r, l.Token()
	for i := range 3 {
		select {
		case <-l.Lost():
			return
		default:
		}
		if !time.Now().Before(l.Session().Deadline()) {
			return
		}
		if !r.slot.CompareAndSwap(0, w.id) {
			r.violation("client %d (token %d) writes while client %d holds the resource", w.id, tok, r.slot.Load())
			return
		}
		if i == 0 {
			// A new grant's token is above every token admitted before.
			// Re-acquiring after an unconfirmed release returns the same
			// grant, which is not new.
			if h := r.fence.Highest(resourceName); tok <= h && !(tok == h && tok == w.lastToken) {
				r.violation("client %d granted token %d, not above %d admitted before", w.id, tok, h)
			}
			w.lastToken = tok
		}
		if err := r.fence.Admit(resourceName, tok); err != nil {
			r.violation("client %d, a current holder, refused by the fence: %v", w.id, err)
		} else {
			r.writes.Add(1)
		}
		if !r.slot.CompareAndSwap(w.id, 0) {
			r.violation("client %d's slot taken by client %d during its write", w.id, r.slot.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// SIGTERM stops a replica cleanly (exit status 0), and its data directory
// opens again: restarted, it rejoins and catches up with what was decided
// while it was down.
func TestSIGTERMAndRestart(t *testing.T) {
	c := newCluster(t, proctest.Options{})
	lead := c.WaitLeader(10 * time.Second)
	if code := c.Terminate(lead, 10*time.Second); code != 0 {
		t.Fatalf("lockd exited %d after SIGTERM", code)
	}
	next := c.WaitLeader(10 * time.Second)
	cl := dial(t, c, c.Addrs())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := cl.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire(ctx, "while-down")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("terminated %d; leader now %d; granted token %d", lead, next, l.Token())

	c.Start(lead)
	c.WaitCaughtUp(lead, uint64(l.Token()), 10*time.Second)
	// And it serves: a client that knows only the restarted replica reads
	// the lock (redirected to the leader as needed).
	only := dial(t, c, c.Addrs(lead))
	info, err := only.Holder(ctx, "while-down")
	if err != nil || info.Holder != s.ID() || info.Token != l.Token() {
		t.Fatalf("Holder through the restarted replica: %+v %v", info, err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// A SIGTERM while the replica has no quorum (its peers are gone) still
// exits promptly and cleanly.
func TestSIGTERMWithoutQuorum(t *testing.T) {
	c := newCluster(t, proctest.Options{})
	c.WaitLeader(10 * time.Second)
	c.Kill(1)
	c.Kill(2)
	start := time.Now()
	if code := c.Terminate(3, 10*time.Second); code != 0 {
		t.Fatalf("lockd exited %d after SIGTERM", code)
	}
	t.Logf("stopped in %v", time.Since(start))
}

func TestSettingsFileAndFlags(t *testing.T) {
	dir := t.TempDir()
	file := dir + "/lockd.json"
	cfg := `{"id": 2, "peers": {"1": "127.0.0.1:7001", "2": "127.0.0.1:7002", "3": "127.0.0.1:7003"},
		"data": "/var/lib/lockd", "ttl": "4s", "tick": "50ms", "election_ticks": 12, "log_level": "warn"}`
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := parseSettings([]string{"-config", file, "-ttl", "6s", "-data", "/tmp/x"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	want := settings{
		ID:            2,
		Peers:         peerList{1: "127.0.0.1:7001", 2: "127.0.0.1:7002", 3: "127.0.0.1:7003"},
		Data:          "/tmp/x",
		ClusterName:   "quorumlock",
		TTL:           duration(6 * time.Second),
		Tick:          duration(50 * time.Millisecond),
		ElectionTicks: 12,
		LogLevel:      "warn",
	}
	if fmt.Sprint(s) != fmt.Sprint(want) {
		t.Fatalf("settings:\n got %+v\nwant %+v", s, want)
	}
	s, err = parseSettings([]string{"-id", "1", "-peers", "1=a:1,2=b:2", "-data", "d"}, os.Stderr)
	if err != nil || s.ID != 1 || s.Peers.String() != "1=a:1,2=b:2" || s.TTL.d() != 10*time.Second {
		t.Fatalf("flags only: %+v %v", s, err)
	}
	for _, bad := range [][]string{
		{"-peers", "1=a:1,1=b:2"},
		{"-peers", "x=a:1"},
		{"-ttl", "soon"},
		{"-config", file, "-peers", "0=a:1"},
		{"stray"},
	} {
		if _, err := parseSettings(bad, io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if err := os.WriteFile(file, []byte(`{"id": 1, "bogus": true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := parseSettings([]string{"-config", file}, io.Discard); err == nil {
		t.Error("unknown key in the config file accepted")
	}
	if err := os.WriteFile(file, []byte(`{"id": 1} {"id": 2}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := parseSettings([]string{"-config", file}, io.Discard); err == nil {
		t.Error("data after the object in the config file accepted")
	}
	if _, _, err := (&settings{ID: 1, Peers: peerList{1: "a:1"}}).config(); err == nil {
		t.Error("config without -data accepted")
	}
	// A zero is refused, not taken for the library's default.
	for _, zero := range [][]string{{"-ttl", "0s"}, {"-tick", "0s"}, {"-election-ticks", "0"}, {"-cluster-name", ""}} {
		s, err := parseSettings(append([]string{"-id", "1", "-peers", "1=127.0.0.1:1", "-data", dir}, zero...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.config(); err == nil || !strings.Contains(err.Error(), zero[0]) {
			t.Errorf("%q: %v", zero, err)
		}
	}
}

// An address in use, whichever flag names it, is a failure to start (exit
// status 1), not a usage error (2).
func TestAddressInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	self := free.Addr().String()
	free.Close()
	base := []string{"-peers", "1=" + self + ",2=127.0.0.1:1,3=127.0.0.1:2", "-id", "1", "-log-level", "error"}
	for _, flags := range [][]string{
		{"-peers", "1=" + busy.Addr().String() + ",2=127.0.0.1:1,3=127.0.0.1:2", "-id", "1", "-log-level", "error"},
		append(slices.Clone(base), "-listen", busy.Addr().String()),
		append(slices.Clone(base), "-metrics", busy.Addr().String()),
	} {
		var stderr strings.Builder
		code := run(append(flags, "-data", t.TempDir()), io.Discard, &stderr)
		if code != 1 || !strings.Contains(stderr.String(), "address already in use") {
			t.Errorf("lockd %q: exit %d, stderr %q", flags, code, stderr.String())
		}
	}
}

// TestMetricsEndpoint: -metrics serves the replica's quorumlock_* metrics
// (and the Go runtime's) over HTTP; exactly one replica reports itself
// leader.
func TestMetricsEndpoint(t *testing.T) {
	addrs := map[uint64]string{}
	for id := uint64(1); id <= 3; id++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[id] = l.Addr().String()
		l.Close()
	}
	c := newCluster(t, proctest.Options{Args: func(id uint64) []string { return []string{"-metrics", addrs[id]} }})
	c.WaitLeader(10 * time.Second)
	leaders := 0
	for id, addr := range addrs {
		var body string
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + addr + "/metrics")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				body = string(b)
				if strings.Contains(body, "quorumlock_raft_term") {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d: no quorumlock metrics at %s (last error %v)", id, addr, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !strings.Contains(body, "go_goroutines") {
			t.Errorf("replica %d: no Go runtime metrics", id)
		}
		if strings.Contains(body, fmt.Sprintf("quorumlock_raft_leader{member=\"%d\"} 1", id)) {
			leaders++
		}
	}
	if leaders != 1 {
		t.Errorf("%d replicas report quorumlock_raft_leader 1, want 1", leaders)
	}
}

// With -tls-peer-ca, the replica trusts client certificates of both CAs,
// but its peer side (which a peer stream's certificate must verify
// against) only the peer CA: a client's certificate cannot pose as a
// member. Without it, one CA serves both.
func TestTLSPeerCA(t *testing.T) {
	dir := t.TempDir()
	peerCA, clientCA := proctest.NewPKI(t, dir, "peers"), proctest.NewPKI(t, dir, "clients")
	cert, key := peerCA.Issue(t, "replica-1")
	verifies := func(pool *x509.CertPool, conf *tls.Config) bool {
		leaf, err := x509.ParseCertificate(conf.Certificates[0].Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err == nil
	}
	app, replica := clientCA.ClientTLS(t, "app"), peerCA.ClientTLS(t, "replica-2")

	server, peer, err := loadTLS(cert, key, clientCA.CAFile, peerCA.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	if !verifies(server.ClientCAs, app) || !verifies(server.ClientCAs, replica) {
		t.Fatal("the server does not trust the client CA and the peer CA")
	}
	if verifies(peer.RootCAs, app) || !verifies(peer.RootCAs, replica) {
		t.Fatal("the peer side trusts the client CA, or not the peer CA")
	}

	server, peer, err = loadTLS(cert, key, peerCA.CAFile, "")
	if err != nil {
		t.Fatal(err)
	}
	if !verifies(server.ClientCAs, replica) || !verifies(peer.RootCAs, replica) {
		t.Fatal("without -tls-peer-ca, -tls-ca is not trusted for both")
	}
	if _, _, err := loadTLS(cert, key, clientCA.CAFile, filepath.Join(dir, "missing.pem")); err == nil || !strings.Contains(err.Error(), "-tls-peer-ca") {
		t.Fatalf("a missing -tls-peer-ca file: %v", err)
	}
}
