package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/proctest"
)

var lockdBin, lockctlBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lockctl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	const lockd, lockctl = "github.com/quorumlock/quorumlock/examples/lockd", "github.com/quorumlock/quorumlock/examples/lockctl"
	bins, err := proctest.Build(dir, lockd, lockctl)
	if err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	lockdBin, lockctlBin = bins[lockd], bins[lockctl]
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func newCluster(t *testing.T, opts proctest.Options) *proctest.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts lockd processes")
	}
	c := proctest.NewCluster(t, lockdBin, opts)
	c.WaitLeader(10 * time.Second)
	return c
}

// ctl runs lockctl against c with args and returns its stdout, stderr and
// exit status.
type ctl struct {
	t     *testing.T
	flags []string // global flags: endpoints, timings, TLS
}

func newCtl(t *testing.T, c *proctest.Cluster, extra ...string) *ctl {
	o := c.Options()
	flags := []string{
		"-endpoints", strings.Join(c.Addrs(), ","),
		"-election-timeout", (time.Duration(o.ElectionTicks) * o.Tick).String(),
		"-timeout", "3s",
	}
	return &ctl{t: t, flags: append(flags, extra...)}
}

func (c *ctl) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, lockctlBin, append(slices.Clone(c.flags), args...)...)
	cmd.Env = append(os.Environ(), "LOCKCTL_ENDPOINTS=")
	return cmd
}

func (c *ctl) run(args ...string) (stdout, stderr string, code int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := c.command(ctx, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		c.t.Fatalf("lockctl %v: %v", args, err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// ok runs lockctl and fails the test unless it exits 0.
func (c *ctl) ok(args ...string) string {
	c.t.Helper()
	out, errs, code := c.run(args...)
	if code != 0 {
		c.t.Fatalf("lockctl %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errs)
	}
	return out
}

func dial(t *testing.T, c *proctest.Cluster) *quorumlock.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := quorumlock.Dial(ctx, c.Addrs(), c.ClientOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestStatusLocksSessions(t *testing.T) {
	c := newCluster(t, proctest.Options{})
	lc := newCtl(t, c)

	out := lc.ok("status")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") {
		t.Fatalf("status:\n%s", out)
	}
	var rows []struct {
		ID       uint64 `json:"id"`
		Leader   uint64 `json:"leader"`
		IsLeader bool   `json:"is_leader"`
		Term     uint64 `json:"term"`
		Commit   uint64 `json:"commit"`
	}
	if err := json.Unmarshal([]byte(lc.ok("status", "-json")), &rows); err != nil || len(rows) != 3 {
		t.Fatalf("status -json: %+v %v", rows, err)
	}
	leaders := 0
	for _, r := range rows {
		if r.IsLeader {
			leaders++
			if r.Leader != r.ID || !strings.Contains(out, fmt.Sprintf("\n%d* ", r.ID)) {
				t.Fatalf("leader %d not marked:\n%s", r.ID, out)
			}
		}
	}
	if leaders != 1 {
		t.Fatalf("%d leaders marked: %+v", leaders, rows)
	}

	if out := lc.ok("locks"); strings.TrimSpace(out) != "NAME  KIND  HOLDER  TOKEN  WAITERS  VALUE" {
		t.Fatalf("locks on an empty cluster:\n%q", out)
	}

	// A holder, a waiter and a leader, from another process's point of
	// view (this test's client), with an observer of the role.
	cl := dial(t, c)
	ctx := testCtx(t)
	obs := lc.command(ctx, "observe", "scheduler")
	obsOut, err := obs.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := obs.Start(); err != nil {
		t.Fatal(err)
	}
	events := bufio.NewReader(obsOut)
	if line, err := events.ReadString('\n'); line != "no leader (last epoch 0)\n" {
		t.Fatalf("observe: first event %q %v", line, err)
	}
	holder, waiter := newSession(t, cl), newSession(t, cl)
	l, err := holder.Acquire(ctx, "db/orders")
	if err != nil {
		t.Fatal(err)
	}
	go waiter.Acquire(ctx, "db/orders")
	ld, err := holder.Elect(ctx, "scheduler", []byte("host-a"))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the waiter to queue", func() bool {
		info, err := cl.Holder(ctx, "db/orders")
		return err == nil && slices.Equal(info.Waiters, []uint64{waiter.ID()})
	})
	want := fmt.Sprintf("leader session=%d epoch=%d value=host-a\n", holder.ID(), ld.Epoch())
	if line, err := events.ReadString('\n'); line != want {
		t.Fatalf("observe: event %q %v, want %q", line, err, want)
	}
	obs.Process.Signal(syscall.SIGTERM)
	if err := obs.Wait(); err != nil {
		t.Fatalf("observe after SIGTERM: %v", err)
	}

	out = lc.ok("locks")
	for _, want := range []string{
		fmt.Sprintf(`scheduler +role +%d +%d +- +host-a`, holder.ID(), ld.Epoch()),
		fmt.Sprintf(`db/orders +lock +%d +%d +%d\b`, holder.ID(), l.Token(), waiter.ID()),
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Fatalf("locks: no line matching %q in\n%s", want, out)
		}
	}
	// Paging: roles come first; -all pages through both kinds.
	out, errs, code := lc.run("locks", "-limit", "1")
	if code != 0 || !strings.Contains(out, "scheduler") || strings.Contains(out, "db/orders") || !strings.Contains(errs, "-all") {
		t.Fatalf("locks -limit 1: exit %d\n%s%s", code, out, errs)
	}
	if out := lc.ok("locks", "-limit", "1", "-all"); !strings.Contains(out, "scheduler") || !strings.Contains(out, "db/orders") {
		t.Fatalf("locks -limit 1 -all:\n%s", out)
	}
	var locks []struct {
		Name    string   `json:"name"`
		Role    bool     `json:"role"`
		Holder  uint64   `json:"holder"`
		Token   uint64   `json:"token"`
		Waiters []uint64 `json:"waiters"`
		Value   string   `json:"value"`
	}
	if err := json.Unmarshal([]byte(lc.ok("locks", "-json")), &locks); err != nil || len(locks) != 2 ||
		!locks[0].Role || locks[0].Value != "host-a" || locks[1].Token != uint64(l.Token()) || !slices.Equal(locks[1].Waiters, []uint64{waiter.ID()}) {
		t.Fatalf("locks -json: %+v %v", locks, err)
	}

	out = lc.ok("sessions")
	for _, want := range []string{
		fmt.Sprintf(`(?m)^%d +2s +2$`, holder.ID()),
		fmt.Sprintf(`(?m)^%d +2s +0$`, waiter.ID()),
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Fatalf("sessions: no line matching %q in\n%s", want, out)
		}
	}
	out, errs, code = lc.run("sessions", "-limit", "1")
	if code != 0 || strings.Count(strings.TrimSpace(out), "\n") != 1 || !strings.Contains(errs, fmt.Sprintf("-after %d", holder.ID())) {
		t.Fatalf("sessions -limit 1: exit %d\n%s%s", code, out, errs)
	}
	if out := lc.ok("sessions", "-after", strconv.FormatUint(holder.ID(), 10)); strings.Contains(out, fmt.Sprintf("\n%d ", holder.ID())) ||
		!strings.Contains(out, fmt.Sprintf("\n%d ", waiter.ID())) {
		t.Fatalf("sessions -after %d:\n%s", holder.ID(), out)
	}

	out = lc.ok("leader", "scheduler")
	if want := fmt.Sprintf("role=scheduler session=%d epoch=%d value=host-a\n", holder.ID(), ld.Epoch()); out != want {
		t.Fatalf("leader: %q, want %q", out, want)
	}
	if _, errs, code := lc.run("leader", "nobody"); code != 1 || !strings.Contains(errs, "no leader") {
		t.Fatalf("leader of an empty role: exit %d %s", code, errs)
	}

	// A replica down: status still shows the others, and fails. The first
	// follower, so that a row follows its error row.
	var down uint64
	for _, r := range rows {
		if !r.IsLeader && down == 0 {
			down = r.ID
		}
	}
	c.Kill(down)
	out, errs, code = lc.run("status")
	if code != 1 || !regexp.MustCompile(regexp.QuoteMeta(c.Addr(down))+`[ -]+error: `).MatchString(out) || !strings.Contains(out, "* ") || !strings.Contains(errs, "1 of 3 replicas did not answer") {
		t.Fatalf("status with replica %d down: exit %d\n%s%s", down, code, out, errs)
	}
	lines = strings.Split(strings.TrimSpace(out), "\n")
	col := strings.Index(lines[0], "TERM")
	for _, line := range lines[1:] {
		if len(line) <= col || line[col-1] != ' ' || line[col] == ' ' {
			t.Fatalf("status with replica %d down: columns not aligned:\n%s", down, out)
		}
	}
}

// Bad invocations exit 2 with usage, failures exit 1 with the error on
// stderr.
func TestUsageAndErrors(t *testing.T) {
	lc := &ctl{t: t, flags: []string{"-endpoints", "127.0.0.1:1", "-timeout", "500ms"}}
	for _, args := range [][]string{{}, {"frobnicate"}, {"revoke-session"}, {"locks", "extra"}, {"acquire"}, {"status", "-bogus"},
		{"-timeout", "0s", "status"}, {"locks", "-election-timeout", "-1s"}, {"acquire", "-wait", "-1s", "x"}, {"acquire", "-kill-grace", "-1s", "x", "true"},
		{"release"}, {"release", "a", "b"}, {"release", "-token", "0", "x"}, {"release", "-token", "", "x"}, {"release", "-token", "t1", "x"}} {
		if _, errs, code := lc.run(args...); code != 2 || !strings.Contains(errs, "usage") {
			t.Errorf("lockctl %q: exit %d, stderr %q", args, code, errs)
		}
	}
	if _, errs, code := lc.run("status"); code != 1 || !strings.Contains(errs, "lockctl status:") {
		t.Errorf("status without a cluster: exit %d, stderr %q", code, errs)
	}
	if _, errs, code := lc.run("revoke-session", "x"); code != 2 || !strings.Contains(errs, "positive integer") {
		t.Errorf("revoke-session x: exit %d, stderr %q", code, errs)
	}
	if _, errs, code := lc.run("-endpoints", "127.0.0.1:1,localhost", "status"); code != 1 || !strings.Contains(errs, "missing port") {
		t.Errorf("an endpoint without a port: exit %d, stderr %q", code, errs)
	}
}

// -endpoints takes gRPC targets with a scheme as Dial does: "dns:///host:port"
// (a name with several addresses) was refused as "too many colons".
func TestEndpointsGRPCTargets(t *testing.T) {
	c := newCluster(t, proctest.Options{})
	lc := newCtl(t, c)
	var targets []string
	for _, a := range c.Addrs() {
		targets = append(targets, "dns:///"+a)
	}
	lc.flags = append(lc.flags, "-endpoints", strings.Join(targets, ","))
	lc.ok("status")
}

func newSession(t *testing.T, cl *quorumlock.Client) *quorumlock.Session {
	t.Helper()
	s, err := cl.NewSession(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s.Close(ctx)
	})
	return s
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// acquire runs a command under the lock with its token in the
// environment, passes on its exit status, and releases the lock.
func TestAcquireRunsCommand(t *testing.T) {
	c := newCluster(t, proctest.Options{})
	lc := newCtl(t, c)
	cl := dial(t, c)
	ctx := testCtx(t)

	out := lc.ok("acquire", "-ttl", "2s", "job", "--", "sh", "-c", `echo "$QUORUMLOCK_TOKEN $QUORUMLOCK_NAME"`)
	fields := strings.Fields(out)
	if len(fields) != 2 || fields[1] != "job" {
		t.Fatalf("command output %q", out)
	}
	tok, err := strconv.ParseUint(fields[0], 10, 64)
	if err != nil || tok == 0 {
		t.Fatalf("QUORUMLOCK_TOKEN %q is not a token", fields[0])
	}
	if info, err := cl.Holder(ctx, "job"); err != nil || info.Holder != 0 || len(info.Waiters) != 0 {
		t.Fatalf("after acquire: %+v %v", info, err)
	}
	if out := lc.ok("sessions"); strings.Count(out, "\n") != 1 {
		t.Fatalf("the session of acquire is still open:\n%s", out)
	}

	// The command's exit status is lockctl's, and the next grant of the
	// lock has a larger token.
	if _, _, code := lc.run("acquire", "job", "--", "sh", "-c", "exit 7"); code != 7 {
		t.Fatalf("exit status %d, want 7", code)
	}
	s := newSession(t, cl)
	l, err := s.Acquire(ctx, "job")
	if err != nil || uint64(l.Token()) <= tok {
		t.Fatalf("next grant: %v %v (first token %d)", l, err, tok)
	}
	// Waiting behind a holder: -wait gives up, not before its time (a
	// deadline made Acquire stop at half of it), and leaves the queue.
	start := time.Now()
	if _, errs, code := lc.run("acquire", "-wait", "500ms", "job", "--", "true"); code != 1 || !strings.Contains(errs, "not granted within 500ms") {
		t.Fatalf("acquire -wait behind a holder: exit %d %s", code, errs)
	}
	if waited := time.Since(start); waited < 500*time.Millisecond {
		t.Fatalf("acquire -wait 500ms gave up after %v", waited)
	}
	if info, err := cl.Holder(ctx, "job"); err != nil || info.Holder != s.ID() || len(info.Waiters) != 0 {
		t.Fatalf("after a -wait timeout: %+v %v", info, err)
	}
}

// Without a command, acquire prints the token and holds the lock until
// SIGTERM, then releases it.
func TestAcquireHoldsUntilSignal(t *testing.T) {
	c := newCluster(t, proctest.Options{})
	lc := newCtl(t, c)
	cl := dial(t, c)
	ctx := testCtx(t)

	cmd := lc.command(ctx, "acquire", "-ttl", "2s", "held")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("no token printed: %v %s", err, errb.String())
	}
	tok, err := strconv.ParseUint(strings.TrimSpace(line), 10, 64)
	if err != nil {
		t.Fatalf("printed %q", line)
	}
	if info, err := cl.Holder(ctx, "held"); err != nil || uint64(info.Token) != tok {
		t.Fatalf("while held: %+v %v (printed %d)", info, err, tok)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v %s", err, errb.String())
	}
	if info, err := cl.Holder(ctx, "held"); err != nil || info.Holder != 0 {
		t.Fatalf("after SIGTERM: %+v %v", info, err)
	}
}

// revoke-session takes a lock from the session that holds it: the waiter
// is granted with a larger token, and the holder learns it lost the lock.
// A lockctl acquire whose session is revoked stops its command and exits 1.
func TestRevokeSession(t *testing.T) {
	c := newCluster(t, proctest.Options{})
	lc := newCtl(t, c)
	cl := dial(t, c)
	ctx := testCtx(t)

	stuck, waiter := newSession(t, cl), newSession(t, cl)
	sl, err := stuck.Acquire(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan *quorumlock.Lock, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "m")
		if err != nil {
			t.Errorf("waiter: %v", err)
		}
		granted <- l
	}()
	waitFor(t, "the waiter to queue", func() bool {
		info, err := cl.Holder(ctx, "m")
		return err == nil && len(info.Waiters) == 1
	})
	if out := lc.ok("revoke-session", strconv.FormatUint(stuck.ID(), 10)); out != fmt.Sprintf("revoked session %d\n", stuck.ID()) {
		t.Fatalf("revoke-session: %q", out)
	}
	select {
	case wl := <-granted:
		if wl == nil || wl.Token() <= sl.Token() {
			t.Fatalf("waiter's token %v not above the revoked holder's %d", wl, sl.Token())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not granted after the revocation")
	}
	select {
	case <-sl.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("revoked holder not told")
	}
	if _, errs, code := lc.run("revoke-session", strconv.FormatUint(stuck.ID(), 10)); code != 1 || !strings.Contains(errs, "session expired") {
		t.Fatalf("second revoke: exit %d %s", code, errs)
	}

	// A lockctl acquire holding a lock for a long command: revoked, it
	// stops the command (SIGTERM) and fails.
	cmd, errb, marker := lc.holdWithCommand(ctx, "long", "2s")
	info, err := cl.Holder(ctx, "long")
	if err != nil || info.Holder == 0 {
		t.Fatalf("long: %+v %v", info, err)
	}
	lc.ok("revoke-session", strconv.FormatUint(info.Holder, 10))
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(errb.String(), "was lost") || strings.Contains(errb.String(), "closing session") {
		t.Fatalf("acquire after revocation: %v\n%s", err, errb.String())
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("command not sent SIGTERM: %v", err)
	}
}

// With mutual TLS on the replicas, lockctl works with a certificate from
// the cluster's CA, and fails without one, with one from another CA, or in
// plaintext.
func TestTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts lockd processes")
	}
	dir := t.TempDir()
	good, evil := proctest.NewPKI(t, dir, "good"), proctest.NewPKI(t, dir, "evil")
	certs := map[uint64][2]string{}
	for id := uint64(1); id <= 3; id++ {
		cert, key := good.Issue(t, fmt.Sprintf("replica-%d", id))
		certs[id] = [2]string{cert, key}
	}
	c := proctest.NewCluster(t, lockdBin, proctest.Options{
		Args: func(id uint64) []string {
			return []string{"-tls-cert", certs[id][0], "-tls-key", certs[id][1], "-tls-ca", good.CAFile}
		},
		ClientTLS: good.ClientTLS(t, "harness"),
	})
	c.WaitLeader(10 * time.Second)

	appCert, appKey := good.Issue(t, "operator")
	lc := newCtl(t, c, "-tls-cert", appCert, "-tls-key", appKey, "-tls-ca", good.CAFile)
	lc.ok("status")
	out := lc.ok("acquire", "tls", "--", "sh", "-c", "echo $QUORUMLOCK_TOKEN")
	if _, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64); err != nil {
		t.Fatalf("acquire over TLS printed %q", out)
	}

	evilCert, evilKey := evil.Issue(t, "intruder")
	for name, flags := range map[string][]string{
		"plaintext":      nil,
		"no certificate": {"-tls-ca", good.CAFile},
		"untrusted CA":   {"-tls-cert", evilCert, "-tls-key", evilKey, "-tls-ca", good.CAFile},
		"unknown server": {"-tls-cert", appCert, "-tls-key", appKey, "-tls-ca", evil.CAFile},
	} {
		bad := newCtl(t, c, append([]string{"-timeout", "1s"}, flags...)...)
		if out, errs, code := bad.run("status"); code == 0 {
			t.Errorf("%s: status succeeded:\n%s", name, out)
		} else if code != 1 || !strings.Contains(errs, "lockctl status:") {
			t.Errorf("%s: exit %d, stderr %q", name, code, errs)
		}
	}
}

// holdWithCommand starts "lockctl acquire NAME -- COMMAND" with a command
// that records a SIGTERM in marker (a file that exists once it got one),
// and returns once the command runs. errb collects acquire's stderr.
func (lc *ctl) holdWithCommand(ctx context.Context, name, killGrace string) (cmd *exec.Cmd, errb *bytes.Buffer, marker string) {
	lc.t.Helper()
	marker = filepath.Join(lc.t.TempDir(), "terminated")
	cmd = lc.command(ctx, "acquire", "-ttl", "2s", "-kill-grace", killGrace, name, "--",
		"sh", "-c", `trap 'echo x > `+marker+`; exit 143' TERM; echo started; while :; do sleep 0.05; done`)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		lc.t.Fatal(err)
	}
	errb = new(bytes.Buffer)
	cmd.Stderr = errb
	if err := cmd.Start(); err != nil {
		lc.t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "started\n" {
		lc.t.Fatalf("command did not start: %q %v %s", line, err, errb.String())
	}
	return cmd, errb, marker
}
