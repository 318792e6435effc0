package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/quorumlock/quorumlock"
)

// acquireCmd holds a lock for a command, in the style of "etcdctl lock" and
// "consul lock": open a session, wait for the grant, run the command with
// the fencing token in its environment, release when it exits. If the lock
// is lost while the command runs (the session expired or was revoked), the
// command gets SIGTERM, then SIGKILL after -kill-grace, and lockctl exits 1:
// the command must not assume it still held the lock, and a resource that
// checks QUORUMLOCK_TOKEN with a fence will have refused it if a newer
// holder came in meanwhile. Without a command, lockctl prints the token and
// holds the lock until SIGINT or SIGTERM (release, exit 0) or until it is
// lost (exit 1).
//
// "Lost" covers "lockctl release" and "lockctl revoke-session" by another
// process: both end this process's session on the cluster, which answers
// its next heartbeat (within TTL/3) with "gone", exactly as for an expired
// session. The client cannot tell the two apart, so neither can lockctl:
// it says the lock was lost, naming both possible causes, and exits 1.
func acquireCmd(fs *flag.FlagSet) func(context.Context, *env) error {
	ttl := fs.Duration("ttl", 10*time.Second, "session TTL: how long the cluster keeps the lock after lockctl stops heartbeating (crash, partition)")
	wait := fs.Duration("wait", 0, "give up if the lock is not granted within this time (0: wait until interrupted)")
	grace := fs.Duration("kill-grace", 5*time.Second, "time COMMAND gets between SIGTERM and SIGKILL when the lock is lost")
	return func(ctx context.Context, e *env) error {
		if len(e.args) == 0 {
			return errUsage
		}
		if *wait < 0 || *grace < 0 {
			return fmt.Errorf("%w: -wait %v, -kill-grace %v: want durations of 0 or more", errUsage, *wait, *grace)
		}
		if *ttl < quorumlock.MinSessionTTL || *ttl > quorumlock.MaxSessionTTL {
			return fmt.Errorf("%w: -ttl %v: want a session TTL in [%v, %v]", errUsage, *ttl, quorumlock.MinSessionTTL, quorumlock.MaxSessionTTL)
		}
		name, argv := e.args[0], e.args[1:]
		if len(argv) > 0 && argv[0] == "--" {
			argv = argv[1:]
		}
		// Caught from here on: an interrupted wait withdraws from the queue,
		// and a held lock is released rather than left to its TTL.
		sigs := make(chan os.Signal, 4)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		defer signal.Stop(sigs)

		cl, err := e.dial(ctx)
		if err != nil {
			return err
		}
		sctx, cancel := context.WithTimeout(ctx, e.g.timeout)
		s, err := cl.NewSession(sctx, quorumlock.WithTTL(*ttl))
		cancel()
		if err != nil {
			return err
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), e.g.timeout)
			defer cancel()
			// An ended session (the lock was lost) has already been reported.
			if err := s.Close(cctx); err != nil && !errors.Is(err, quorumlock.ErrSessionExpired) {
				fmt.Fprintf(e.stderr, "lockctl acquire: closing session %d: %v\n", s.ID(), err)
			}
		}()

		l, err := acquireInterruptibly(ctx, s, name, *wait, sigs)
		if err != nil {
			return err
		}
		if len(argv) == 0 {
			return holdUntilSignal(e, l, sigs)
		}
		return runHolding(e, l, argv, *grace, sigs)
	}
}

// errWaitOver ends an acquire's wait when -wait runs out.
var errWaitOver = errors.New("wait over")

// acquireInterruptibly waits for the grant until it comes, wait runs out
// (if non-zero), or a signal arrives.
func acquireInterruptibly(ctx context.Context, s *quorumlock.Session, name string, wait time.Duration, sigs <-chan os.Signal) (*quorumlock.Lock, error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if wait > 0 {
		// A timer, not a deadline: Acquire stops waiting up to a tenth
		// of the time before a deadline to settle its outcome within it,
		// so a deadline would give up early (after 0.9s of -wait 1s).
		// Cancelled, it waits the whole time and then settles.
		t := time.AfterFunc(wait, func() { cancel(errWaitOver) })
		defer t.Stop()
	}
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case sig := <-sigs:
			cancel(fmt.Errorf("interrupted by %v while waiting", sig))
		case <-done:
		}
	}()
	l, err := s.Acquire(actx, name)
	close(done)
	<-watched
	cause := context.Cause(actx)
	if err != nil {
		if errors.Is(cause, errWaitOver) {
			switch {
			case errors.Is(err, quorumlock.ErrWithdrawPending):
				return nil, fmt.Errorf("lock %q: not granted within %v (no leader has confirmed that the session left the queue)", name, wait)
			case s.Err() == nil && errors.Is(err, context.Canceled):
				// The wait ran out and the session left the queue:
				// "context canceled" would only confuse.
				return nil, fmt.Errorf("lock %q: not granted within %v", name, wait)
			}
			return nil, fmt.Errorf("lock %q: not granted within %v: %w", name, wait, err)
		}
		if cause != nil {
			return nil, fmt.Errorf("lock %q: %w", name, cause)
		}
		return nil, fmt.Errorf("lock %q: %w", name, err)
	}
	if cause != nil && !errors.Is(cause, errWaitOver) {
		// The grant won the race with the interruption: give it back.
		release(l)
		return nil, fmt.Errorf("lock %q: %w", name, cause)
	}
	return l, nil
}

// holdUntilSignal prints the token and holds the lock until a signal, or
// fails when the lock is lost (expired, or freed by lockctl release).
func holdUntilSignal(e *env, l *quorumlock.Lock, sigs <-chan os.Signal) error {
	fmt.Fprintln(e.stdout, l.Token())
	select {
	case <-sigs:
		return release(l)
	case <-l.Lost():
		return lostError(l)
	}
}

// runHolding runs argv while holding l and returns its exit status as an
// exitError (nil for 0), or an error if the lock was lost.
func runHolding(e *env, l *quorumlock.Lock, argv []string, grace time.Duration, sigs <-chan os.Signal) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, e.stdout, e.stderr
	cmd.Env = append(os.Environ(),
		"QUORUMLOCK_TOKEN="+strconv.FormatUint(uint64(l.Token()), 10),
		"QUORUMLOCK_NAME="+l.Name(),
		"QUORUMLOCK_SESSION="+strconv.FormatUint(l.Session().ID(), 10),
	)
	// Bounds the wait for output a killed command's children keep open.
	cmd.WaitDelay = grace
	if err := cmd.Start(); err != nil {
		release(l)
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	lost := l.Lost()
	var wasLost bool
	var kill <-chan time.Time
	var waitErr error
wait:
	for {
		select {
		case waitErr = <-exited:
			break wait
		case sig := <-sigs:
			// Forwarded; the lock is released once the command has exited.
			cmd.Process.Signal(sig)
		case <-lost:
			lost, wasLost = nil, true
			fmt.Fprintf(e.stderr, "lockctl acquire: lock %q lost (%v): stopping the command\n", l.Name(), l.Session().Err())
			cmd.Process.Signal(syscall.SIGTERM)
			kill = time.After(grace)
		case <-kill:
			cmd.Process.Kill()
		}
	}
	if wasLost {
		return lostError(l)
	}
	if err := release(l); errors.Is(err, quorumlock.ErrNotHeld) || errors.Is(err, quorumlock.ErrSessionExpired) {
		// Lost between the command's last action and its exit, unnoticed
		// until now: the command may have run without the lock at the end.
		return lostError(l)
	} else if err != nil {
		fmt.Fprintf(e.stderr, "lockctl acquire: releasing %q: %v\n", l.Name(), err)
	}
	return exitStatus(cmd.ProcessState, waitErr)
}

func release(l *quorumlock.Lock) error {
	ctx, cancel := context.WithTimeout(context.Background(), l.Session().TTL())
	defer cancel()
	return l.Release(ctx)
}

func lostError(l *quorumlock.Lock) error {
	cause := l.Session().Err()
	if cause == nil {
		cause = quorumlock.ErrNotHeld
	}
	why := ""
	if errors.Is(cause, quorumlock.ErrSessionExpired) {
		// Expiry and revocation look the same from here.
		why = " (its session ended: it expired, or lockctl release or revoke-session revoked it)"
	}
	return fmt.Errorf("lock %q (token %d) was lost while held%s: %w", l.Name(), l.Token(), why, cause)
}

// exitStatus maps the command's end to lockctl's: its exit code, or 128 +
// the signal that killed it, as shells do.
func exitStatus(ps *os.ProcessState, waitErr error) error {
	if ps == nil {
		return waitErr
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitError(128 + int(ws.Signal()))
	}
	if code := ps.ExitCode(); code != 0 {
		return exitError(code)
	}
	if waitErr != nil && !errors.As(waitErr, new(*exec.ExitError)) {
		// Exit 0, but its output could not be copied in full.
		return waitErr
	}
	return nil
}
