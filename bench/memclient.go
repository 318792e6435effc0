package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/quorumlock/quorumlock"
)

// memory_1m holds quorumlock's locks from a separate client process, so that
// the benchmark process's heap holds the three replicas and no client-side
// Session or Lock handle. The benchmark binary re-executes itself with the
// hidden first argument memClientCmd. The protocol, one line each:
//
//	child -> parent (stdout): "SESSIONS <heap bytes after Dial> <heap bytes with sessions>"
//	parent -> child (stdin):  "GO"
//	child -> parent (stdout): "READY <acquires/s> <locks> <heap bytes with locks>"
//
// after which the child holds the locks (its sessions heartbeat) until its
// stdin closes or it gets SIGTERM/SIGINT, and then exits. The heap figures
// are the child's own live heap (stableHeap), for the notes.
const memClientCmd = "memory-client"

// memClientConfig is what the client process is told.
type memClientConfig struct {
	addrs    []string      // the replicas' addresses
	sessions int           // sessions to open
	per      int           // locks per session
	ttl      time.Duration // session TTL
	workers  int           // concurrent openers and acquirers
}

// args returns the command line (after the executable) that runs the
// client process with c.
func (c memClientConfig) args() []string {
	return []string{memClientCmd,
		"-addrs", strings.Join(c.addrs, ","),
		"-sessions", strconv.Itoa(c.sessions),
		"-per", strconv.Itoa(c.per),
		"-ttl", c.ttl.String(),
		"-workers", strconv.Itoa(c.workers),
	}
}

// parseMemClientArgs parses the arguments after memClientCmd.
func parseMemClientArgs(args []string) (memClientConfig, error) {
	var c memClientConfig
	fs := flag.NewFlagSet(memClientCmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addrs := fs.String("addrs", "", "comma-separated replica addresses")
	fs.IntVar(&c.sessions, "sessions", 0, "sessions to open")
	fs.IntVar(&c.per, "per", 0, "locks per session")
	fs.DurationVar(&c.ttl, "ttl", quorumlock.MaxSessionTTL, "session TTL")
	fs.IntVar(&c.workers, "workers", 256, "concurrent workers")
	if err := fs.Parse(args); err != nil {
		return c, fmt.Errorf("%s: %w", memClientCmd, err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("%s: unexpected arguments %q", memClientCmd, fs.Args())
	}
	for a := range strings.SplitSeq(*addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			c.addrs = append(c.addrs, a)
		}
	}
	switch {
	case len(c.addrs) == 0:
		return c, fmt.Errorf("%s: no -addrs", memClientCmd)
	case c.sessions <= 0 || c.per <= 0 || c.workers <= 0:
		return c, fmt.Errorf("%s: -sessions, -per and -workers must be positive", memClientCmd)
	}
	return c, nil
}

// memClientMain is the client process: see memClientCmd. It returns the
// exit code.
func memClientMain(args []string, stdin io.Reader, stdout io.Writer) int {
	c, err := parseMemClientArgs(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	if err := runMemClient(c, stdin, stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", memClientCmd+":", err)
		return 1
	}
	return 0
}

func runMemClient(c memClientConfig, stdin io.Reader, stdout io.Writer) error {
	// Everything stops when the parent closes stdin or sends a signal.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	goSignal := make(chan struct{})
	go func() {
		defer cancel(errStdinClosed)
		sc := bufio.NewScanner(stdin)
		for started := false; sc.Scan(); {
			if strings.TrimSpace(sc.Text()) == "GO" && !started {
				close(goSignal)
				started = true
			}
		}
	}()

	cl, err := quorumlock.Dial(ctx, c.addrs, quorumlock.WithElectionTimeout(election))
	if err != nil {
		return fmt.Errorf("dialing %v: %w%s", c.addrs, err, why(ctx))
	}
	defer cl.Close()
	hDial := stableHeap()
	ss := make([]*quorumlock.Session, c.sessions)
	pr := newProgress("client: open sessions", c.sessions)
	err = parallel(ctx, c.sessions, c.workers, func(ctx context.Context, i int) error {
		s, err := cl.NewSession(ctx, quorumlock.WithTTL(c.ttl))
		if err != nil {
			return err
		}
		ss[i] = s
		pr.add(1)
		return nil
	})
	pr.finish()
	if err != nil {
		return fmt.Errorf("opening sessions: %w%s", err, why(ctx))
	}
	hSessions := stableHeap()
	fmt.Fprintf(stdout, "SESSIONS %d %d\n", hDial, hSessions)

	select {
	case <-goSignal:
	case <-ctx.Done():
		return fmt.Errorf("waiting for GO: %w", context.Cause(ctx))
	}
	locks := make([][]*quorumlock.Lock, c.sessions)
	pr = newProgress("client: acquire locks", c.sessions*c.per)
	err = parallel(ctx, c.sessions, c.workers, func(ctx context.Context, i int) error {
		ls := make([]*quorumlock.Lock, c.per)
		for j := range ls {
			l, err := ss[i].Acquire(ctx, fmt.Sprintf("m/%d/%d", i, j))
			if err != nil {
				return err
			}
			ls[j] = l
		}
		locks[i] = ls
		pr.add(c.per)
		return nil
	})
	el := pr.finish()
	if err != nil {
		return fmt.Errorf("acquiring locks: %w%s", err, why(ctx))
	}
	n := c.sessions * c.per
	hLocks := stableHeap()
	fmt.Fprintf(stdout, "READY %.1f %d %d\n", float64(n)/el.Seconds(), n, hLocks)

	// Hold until told to stop. A session that ended in the meantime would
	// mean the parent measured fewer locks than reported: that fails the
	// run.
	<-ctx.Done()
	ended := 0
	var first error
	for _, s := range ss {
		select {
		case <-s.Done():
			if ended++; first == nil {
				first = s.Err()
			}
		default:
		}
	}
	runtime.KeepAlive(locks)
	if ended > 0 {
		return fmt.Errorf("%d of %d sessions ended while holding their locks (first: %v)", ended, len(ss), first)
	}
	return nil
}

var errStdinClosed = errors.New("stdin closed")

// why says why ctx ended, if it has.
func why(ctx context.Context) string {
	if ctx.Err() == nil {
		return ""
	}
	return fmt.Sprintf(" (%v)", context.Cause(ctx))
}

// memClient is the parent's handle on a running client process.
type memClient struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // the child's stdout, closed at its EOF
	waited bool
}

// startMemClient re-executes this binary as the client process. Its
// stderr (progress) goes to ours.
func startMemClient(c memClientConfig) (*memClient, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, c.args()...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the client process: %w", err)
	}
	mc := &memClient{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		defer close(mc.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			mc.lines <- sc.Text()
		}
	}()
	return mc, nil
}

// expect waits for the child's next line that starts with word and returns
// its fields after word.
func (mc *memClient) expect(ctx context.Context, word string) ([]string, error) {
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the client process's %s: %w", word, ctx.Err())
		case line, ok := <-mc.lines:
			if !ok {
				return nil, fmt.Errorf("the client process ended before %s: %v", word, mc.wait(5*time.Second))
			}
			f := strings.Fields(line)
			if len(f) > 0 && f[0] == word {
				return f[1:], nil
			}
			logf("  client process: %s", line)
		}
	}
}

func (mc *memClient) send(line string) error {
	_, err := io.WriteString(mc.stdin, line+"\n")
	return err
}

// stop closes the child's stdin (its signal to let go and exit) and waits
// up to timeout for it to exit, then kills it.
func (mc *memClient) stop(timeout time.Duration) error {
	mc.stdin.Close()
	return mc.wait(timeout)
}

// wait waits up to timeout for the child to close its stdout and exit,
// killing it after that. Calling it again returns nil.
func (mc *memClient) wait(timeout time.Duration) error {
	if mc.waited {
		return nil
	}
	mc.waited = true
	t := time.NewTimer(timeout)
	defer t.Stop()
	var killed error
	// Drain stdout first: Wait closes the pipe.
	for drained := false; !drained; {
		select {
		case _, ok := <-mc.lines:
			drained = !ok
		case <-t.C:
			mc.cmd.Process.Kill()
			killed = fmt.Errorf("the client process did not exit within %v; killed", timeout)
			t.Reset(5 * time.Second)
		}
	}
	err := mc.cmd.Wait()
	if killed != nil {
		return killed
	}
	return err
}

// kill ends the child at once unless it has been waited for (for defer).
func (mc *memClient) kill() {
	if mc.waited {
		return
	}
	mc.cmd.Process.Kill()
	mc.wait(5 * time.Second)
}

// parseUints parses f as unsigned integers (the heap figures).
func parseUints(f []string) ([]uint64, error) {
	out := make([]uint64, len(f))
	for i, s := range f {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}
