// Package proctest runs quorumlock's programs as separate processes for
// tests: it builds them, starts a cluster of lockd replicas on loopback
// ports with their own data directories, and signals them (SIGKILL,
// SIGSTOP/SIGCONT, SIGTERM). Unlike internal/testcluster, the replicas
// share nothing with the test process but the network, so a paused or
// killed replica is paused or killed for real.
package proctest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
)

// Build compiles the main packages pkgs (import paths) into dir with the go
// command and returns each binary's path by import path. Run it once per
// test binary (TestMain): it takes seconds.
func Build(dir string, pkgs ...string) (map[string]string, error) {
	return BuildTags(dir, "", pkgs...)
}

// BuildTags is Build with build tags (go build -tags tags; "" for none).
func BuildTags(dir, tags string, pkgs ...string) (map[string]string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("proctest: the go command is needed to build %v: %w", pkgs, err)
	}
	out := make(map[string]string, len(pkgs))
	for _, pkg := range pkgs {
		bin := filepath.Join(dir, filepath.Base(pkg))
		args := []string{"build", "-o", bin}
		if tags != "" {
			args = append(args, "-tags", tags)
		}
		cmd := exec.Command(goTool, append(args, pkg)...)
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("proctest: go build %s: %v\n%s", pkg, err, b)
		}
		out[pkg] = bin
	}
	return out, nil
}

// Options configure a Cluster. Zero fields take the defaults.
type Options struct {
	// Size is the number of replicas. The default is 3.
	Size int
	// TTL, Tick and ElectionTicks are passed to every replica. The defaults
	// are 2 s, 20 ms and 10 (a 200 ms election timeout).
	TTL           time.Duration
	Tick          time.Duration
	ElectionTicks int
	// Args, if set, returns extra flags for replica id (TLS files, say).
	Args func(id uint64) []string
	// Env, if set, returns extra environment variables (KEY=value) for
	// replica id, asked at every start.
	Env func(id uint64) []string
	// ClientTLS is what the harness's own clients (Status, WaitLeader) and
	// ClientOptions use to reach a cluster that runs TLS. nil: plaintext.
	ClientTLS *tls.Config
}

func (o *Options) withDefaults() {
	if o.Size == 0 {
		o.Size = 3
	}
	if o.TTL == 0 {
		o.TTL = 2 * time.Second
	}
	if o.Tick == 0 {
		o.Tick = 20 * time.Millisecond
	}
	if o.ElectionTicks == 0 {
		o.ElectionTicks = 10
	}
}

// readyTimeout bounds a replica's start-up (opening its log, listening).
const readyTimeout = 30 * time.Second

// Cluster is a set of lockd processes. Its methods may be called from the
// test goroutine only; they fail the test on error.
type Cluster struct {
	t     testing.TB
	bin   string
	dir   string
	opts  Options
	peers map[uint64]string

	mu    sync.Mutex
	procs map[uint64]*proc
}

type proc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process is reaped
	state  *os.ProcessState
	paused bool
}

// NewCluster starts opts.Size lockd replicas (the binary bin) on free
// loopback ports, each with a data directory under t.TempDir(), and waits
// until every one prints its ready line. The processes are killed in
// t.Cleanup, paused ones included; the tail of each replica's log is
// printed if the test failed.
func NewCluster(t testing.TB, bin string, opts Options) *Cluster {
	t.Helper()
	opts.withDefaults()
	c := &Cluster{t: t, bin: bin, dir: t.TempDir(), opts: opts, peers: map[uint64]string{}, procs: map[uint64]*proc{}}
	for i, a := range freeAddrs(t, opts.Size) {
		c.peers[uint64(i+1)] = a
	}
	t.Cleanup(c.cleanup)
	errs := make(chan error, opts.Size)
	for _, id := range c.IDs() {
		go func() { errs <- c.start(id) }()
	}
	for range opts.Size {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// freeAddrs returns n distinct free loopback addresses. The listeners are
// all held open until every port is picked: one closed at once could be
// handed out again by the next Listen (CI saw two members share a port).
//
// The ports are below the kernel's ephemeral range where it can tell
// (ip_local_port_range): a replica killed and restarted binds its port
// again, and a port from that range may meanwhile be the local end of an
// outgoing connection, which makes the bind fail with EADDRINUSE (CI saw
// it: a client's connection took a killed replica's port).
func freeAddrs(t testing.TB, n int) []string {
	t.Helper()
	out := make([]string, 0, n)
	lo := ephemeralLow()
	for range n {
		var l net.Listener
		var err error
		for try := 0; lo > minPort && try < 100; try++ {
			port := minPort + rand.IntN(lo-minPort)
			if l, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
				break
			}
		}
		if l == nil {
			if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
				t.Fatal(err)
			}
		}
		defer l.Close()
		out = append(out, l.Addr().String())
	}
	return out
}

// minPort is the lowest port freeAddrs picks outside the ephemeral range.
const minPort = 10000

// ephemeralLow returns the low end of the kernel's ephemeral port range
// (Linux: /proc/sys/net/ipv4/ip_local_port_range), or 0 if unknown.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return lo
}

// IDs returns the member IDs in ascending order.
func (c *Cluster) IDs() []uint64 {
	ids := make([]uint64, 0, len(c.peers))
	for id := range c.peers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Addr returns replica id's address.
func (c *Cluster) Addr(id uint64) string { return c.peers[id] }

// Addrs returns the addresses of ids, or of every replica if none given.
func (c *Cluster) Addrs(ids ...uint64) []string {
	if len(ids) == 0 {
		ids = c.IDs()
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = c.peers[id]
	}
	return out
}

// DataDir returns replica id's data directory.
func (c *Cluster) DataDir(id uint64) string { return filepath.Join(c.dir, fmt.Sprintf("data-%d", id)) }

// LogFile returns the file that collects replica id's stderr, across
// restarts.
func (c *Cluster) LogFile(id uint64) string {
	return filepath.Join(c.dir, fmt.Sprintf("lockd-%d.log", id))
}

// Options returns the cluster's options, defaults applied.
func (c *Cluster) Options() Options { return c.opts }

// PeersFlag returns the -peers value of the cluster.
func (c *Cluster) PeersFlag() string {
	var parts []string
	for _, id := range c.IDs() {
		parts = append(parts, fmt.Sprintf("%d=%s", id, c.peers[id]))
	}
	return strings.Join(parts, ",")
}

// Start (re)starts replica id on its address and data directory and waits
// for its ready line. The replica must not be running.
func (c *Cluster) Start(id uint64) {
	c.t.Helper()
	if err := c.start(id); err != nil {
		c.t.Fatal(err)
	}
}

func (c *Cluster) start(id uint64) error {
	c.mu.Lock()
	if p := c.procs[id]; p != nil && !p.done() {
		c.mu.Unlock()
		return fmt.Errorf("proctest: replica %d is running", id)
	}
	c.mu.Unlock()
	args := []string{
		"-id", strconv.FormatUint(id, 10),
		"-peers", c.PeersFlag(),
		"-data", c.DataDir(id),
		"-ttl", c.opts.TTL.String(),
		"-tick", c.opts.Tick.String(),
		"-election-ticks", strconv.Itoa(c.opts.ElectionTicks),
	}
	if c.opts.Args != nil {
		args = append(args, c.opts.Args(id)...)
	}
	logf, err := os.OpenFile(c.LogFile(id), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.Command(c.bin, args...)
	if c.opts.Env != nil {
		if env := c.opts.Env(id); len(env) > 0 {
			cmd.Env = append(os.Environ(), env...)
		}
	}
	cmd.Stdout, cmd.Stderr = w, logf
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("proctest: starting replica %d: %w", id, err)
	}
	w.Close()
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		p.state = cmd.ProcessState
		close(p.exited)
	}()
	c.mu.Lock()
	c.procs[id] = p
	c.mu.Unlock()

	ready := make(chan string, 1)
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "lockd ready ") {
				select {
				case ready <- sc.Text():
				default:
				}
			}
		}
	}()
	want := fmt.Sprintf("lockd ready id=%d addr=%s", id, c.peers[id])
	select {
	case line := <-ready:
		if line != want {
			return fmt.Errorf("proctest: replica %d said %q, want %q", id, line, want)
		}
		return nil
	case <-p.exited:
		return fmt.Errorf("proctest: replica %d exited before it was ready (%v); log:\n%s", id, p.state, c.tail(id, 30))
	case <-time.After(readyTimeout):
		return fmt.Errorf("proctest: replica %d not ready after %v; log:\n%s", id, readyTimeout, c.tail(id, 30))
	}
}

func (p *proc) done() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

func (c *Cluster) proc(id uint64) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.procs[id]
	if p == nil {
		c.t.Fatalf("proctest: replica %d was never started", id)
	}
	return p
}

// Kill sends SIGKILL to replica id and waits until it is gone.
func (c *Cluster) Kill(id uint64) {
	c.t.Helper()
	p := c.proc(id)
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Signal sends sig to replica id (if it is running).
func (c *Cluster) Signal(id uint64, sig syscall.Signal) error {
	p := c.proc(id)
	if p.done() {
		return fmt.Errorf("proctest: replica %d is not running", id)
	}
	return p.cmd.Process.Signal(sig)
}

// Pause stops replica id with SIGSTOP: it keeps its sockets open and
// answers nothing until Resume.
func (c *Cluster) Pause(id uint64) {
	c.t.Helper()
	p := c.proc(id)
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		c.t.Fatalf("proctest: SIGSTOP %d: %v", id, err)
	}
	c.mu.Lock()
	p.paused = true
	c.mu.Unlock()
}

// Resume continues replica id with SIGCONT.
func (c *Cluster) Resume(id uint64) {
	c.t.Helper()
	p := c.proc(id)
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		c.t.Fatalf("proctest: SIGCONT %d: %v", id, err)
	}
	c.mu.Lock()
	p.paused = false
	c.mu.Unlock()
}

// Terminate sends SIGTERM to replica id and returns its exit status once it
// has exited, or fails the test after timeout.
func (c *Cluster) Terminate(id uint64, timeout time.Duration) int {
	c.t.Helper()
	p := c.proc(id)
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.state.ExitCode()
	case <-time.After(timeout):
		c.t.Fatalf("proctest: replica %d still running %v after SIGTERM; log:\n%s", id, timeout, c.tail(id, 30))
		return -1
	}
}

// Running reports whether replica id is up and not paused.
func (c *Cluster) Running(id uint64) bool {
	p := c.proc(id)
	c.mu.Lock()
	defer c.mu.Unlock()
	return !p.done() && !p.paused
}

// Status asks every running replica for its view, each within timeout.
// Replicas that do not answer are left out.
func (c *Cluster) Status(timeout time.Duration) map[uint64]quorumlock.Status {
	out := map[uint64]quorumlock.Status{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, id := range c.IDs() {
		if !c.Running(id) {
			continue
		}
		wg.Go(func() {
			if st, err := c.status(id, timeout); err == nil {
				mu.Lock()
				out[id] = st
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// status asks one replica, over a client of its own: Client.Status asks
// every replica the client knows.
func (c *Cluster) status(id uint64, timeout time.Duration) (quorumlock.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cl, err := quorumlock.Dial(ctx, []string{c.peers[id]}, c.ClientOptions()...)
	if err != nil {
		return quorumlock.Status{}, err
	}
	defer cl.Close()
	rs := cl.Status(ctx)
	if rs[0].Err != nil {
		return quorumlock.Status{}, rs[0].Err
	}
	return rs[0].Status, nil
}

var errNoLeader = errors.New("proctest: no leader")

// ClientOptions are the Dial options matching the cluster: its TTL and
// election timeout, and Options.ClientTLS.
func (c *Cluster) ClientOptions() []quorumlock.ClientOption {
	opts := []quorumlock.ClientOption{
		quorumlock.WithSessionTTL(c.opts.TTL),
		quorumlock.WithElectionTimeout(time.Duration(c.opts.ElectionTicks) * c.opts.Tick),
	}
	if c.opts.ClientTLS != nil {
		opts = append(opts, quorumlock.WithTLS(c.opts.ClientTLS))
	}
	return opts
}

// WaitLeader waits until a running replica leads with the support of a
// majority of the running ones (they name it leader at its term), and
// returns its ID.
func (c *Cluster) WaitLeader(timeout time.Duration) uint64 {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		id, err := c.leader()
		if err == nil {
			return id
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("proctest: no leader within %v: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) leader() (uint64, error) {
	sts := c.Status(time.Second)
	for id, st := range sts {
		if st.Leader != id {
			continue
		}
		votes := 0
		for _, o := range sts {
			if o.Leader == id && o.Term == st.Term {
				votes++
			}
		}
		if votes > len(c.peers)/2 {
			return id, nil
		}
	}
	return 0, fmt.Errorf("%w among %+v", errNoLeader, sts)
}

// WaitCaughtUp waits until replica id follows a leader and has applied at
// least index.
func (c *Cluster) WaitCaughtUp(id uint64, index uint64, timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st, err := c.status(id, time.Second)
		if err == nil && st.Leader != 0 && st.Applied >= index {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("proctest: replica %d not caught up to %d within %v: %+v %v", id, index, timeout, st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) cleanup() {
	c.mu.Lock()
	procs := make(map[uint64]*proc, len(c.procs))
	for id, p := range c.procs {
		procs[id] = p
	}
	c.mu.Unlock()
	for _, p := range procs {
		// Continued first, so that nothing is left stopped whatever
		// happens to the kill.
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Signal(syscall.SIGKILL)
	}
	for _, p := range procs {
		<-p.exited
	}
	if c.t.Failed() {
		for _, id := range c.IDs() {
			c.t.Logf("--- lockd %d log (tail) ---\n%s", id, c.tail(id, 60))
		}
	}
}

// tail returns the last n lines of replica id's log.
func (c *Cluster) tail(id uint64, n int) string {
	b, err := os.ReadFile(c.LogFile(id))
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
