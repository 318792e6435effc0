package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/proctest"
)

// release frees a lock by revoking its holder's session, only when that
// session holds nothing else and, with -token, only for that grant.
func TestRelease(t *testing.T) {
	c := newCluster(t, proctest.Options{})
	lc := newCtl(t, c)
	cl := dial(t, c)

	// The holder's session is revoked, the waiter is granted with a larger
	// token, and the holder learns it lost the lock.
	t.Run("frees the lock", func(t *testing.T) {
		ctx := testCtx(t)
		holder, waiter := newSession(t, cl), newSession(t, cl)
		hl, err := holder.Acquire(ctx, "r/held")
		if err != nil {
			t.Fatal(err)
		}
		granted := make(chan *quorumlock.Lock, 1)
		go func() {
			l, err := waiter.Acquire(ctx, "r/held")
			if err != nil {
				t.Errorf("waiter: %v", err)
			}
			granted <- l
		}()
		waitFor(t, "the waiter to queue", func() bool {
			info, err := cl.Holder(ctx, "r/held")
			return err == nil && slices.Equal(info.Waiters, []uint64{waiter.ID()})
		})
		out := lc.ok("release", "r/held")
		if want := fmt.Sprintf("released r/held: revoked session %d, which held it with token %d\n", holder.ID(), hl.Token()); out != want {
			t.Fatalf("release: %q, want %q", out, want)
		}
		var wl *quorumlock.Lock
		select {
		case wl = <-granted:
		case <-ctx.Done():
			t.Fatal("waiter not granted after release")
		}
		if wl == nil || wl.Token() <= hl.Token() {
			t.Fatalf("next grant %v: token not above the released %d", wl, hl.Token())
		}
		if info, err := cl.Holder(ctx, "r/held"); err != nil || info.Holder != waiter.ID() || info.Token != wl.Token() {
			t.Fatalf("after release: %+v %v, want session %d token %d", info, err, waiter.ID(), wl.Token())
		}
		select {
		case <-hl.Lost():
		case <-ctx.Done():
			t.Fatal("released holder not told")
		}
		if !errors.Is(holder.Err(), quorumlock.ErrSessionExpired) {
			t.Fatalf("released holder's session: %v", holder.Err())
		}
	})

	// A -token that is not the current grant's, older or newer, frees
	// nothing.
	t.Run("wrong token refused", func(t *testing.T) {
		ctx := testCtx(t)
		holder := newSession(t, cl)
		hl, err := holder.Acquire(ctx, "r/token")
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range []uint64{uint64(hl.Token()) - 1, uint64(hl.Token()) + 1} {
			out, errs, code := lc.run("release", "-token", strconv.FormatUint(tok, 10), "r/token")
			want := fmt.Sprintf("held by session %d with token %d, not %d: not released", holder.ID(), hl.Token(), tok)
			if code != 1 || out != "" || !strings.Contains(errs, want) {
				t.Fatalf("release -token %d: exit %d\nstdout: %q\nstderr: %q", tok, code, out, errs)
			}
		}
		if info, err := cl.Holder(ctx, "r/token"); err != nil || info.Holder != holder.ID() || info.Token != hl.Token() {
			t.Fatalf("after refused releases: %+v %v", info, err)
		}
		select {
		case <-hl.Lost():
			t.Fatalf("holder lost the lock: %v", holder.Err())
		default:
		}
		// The right token frees it.
		out := lc.ok("release", "-token", strconv.FormatUint(uint64(hl.Token()), 10), "r/token")
		if !strings.HasPrefix(out, "released r/token: ") {
			t.Fatalf("release with the current token: %q", out)
		}
		if info, err := cl.Holder(ctx, "r/token"); err != nil || info.Holder != 0 {
			t.Fatalf("after release: %+v %v", info, err)
		}
	})

	t.Run("free lock", func(t *testing.T) {
		for _, args := range [][]string{{"release", "r/never"}, {"release", "-token", "5", "r/never"}} {
			out, errs, code := lc.run(args...)
			if code != 1 || out != "" || !strings.Contains(errs, `lock "r/never" is not held: nothing to release`) {
				t.Fatalf("lockctl %q: exit %d\nstdout: %q\nstderr: %q", args, code, out, errs)
			}
		}
	})

	// A session that holds another lock or a role too is not revoked:
	// release would free what the caller did not name.
	t.Run("holder holds more", func(t *testing.T) {
		ctx := testCtx(t)
		locks, role := newSession(t, cl), newSession(t, cl)
		l1, err := locks.Acquire(ctx, "r/a")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := locks.Acquire(ctx, "r/b"); err != nil {
			t.Fatal(err)
		}
		if _, err := role.Acquire(ctx, "r/c"); err != nil {
			t.Fatal(err)
		}
		if _, err := role.Elect(ctx, "r/role", []byte("v")); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			s    *quorumlock.Session
		}{{"r/a", locks}, {"r/c", role}} {
			out, errs, code := lc.run("release", tc.name)
			if code != 1 || out != "" || !strings.Contains(errs, fmt.Sprintf("session %d holds 1 other locks or roles besides %q: not released", tc.s.ID(), tc.name)) ||
				!strings.Contains(errs, fmt.Sprintf("lockctl revoke-session %d", tc.s.ID())) {
				t.Fatalf("release %s: exit %d\nstdout: %q\nstderr: %q", tc.name, code, out, errs)
			}
		}
		for name, want := range map[string]uint64{"r/a": locks.ID(), "r/b": locks.ID(), "r/c": role.ID()} {
			if info, err := cl.Holder(ctx, name); err != nil || info.Holder != want {
				t.Fatalf("%s after refused releases: %+v %v, want holder %d", name, info, err, want)
			}
		}
		if li, err := cl.Leader(ctx, "r/role"); err != nil || li.Session != role.ID() {
			t.Fatalf("r/role after refused releases: %+v %v", li, err)
		}
		if locks.Err() != nil || role.Err() != nil {
			t.Fatalf("sessions ended: %v, %v", locks.Err(), role.Err())
		}
		// Once the others are released, release frees the last one.
		if err := l1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		out, errs, code := lc.run("release", "r/b")
		if code != 0 || !strings.HasPrefix(out, fmt.Sprintf("released r/b: revoked session %d,", locks.ID())) {
			t.Fatalf("release r/b, the session's only lock: exit %d\nstdout: %q\nstderr: %q", code, out, errs)
		}
	})

	// An acquire running a command loses its lock as on any revocation:
	// the command gets SIGTERM, and acquire exits 1.
	t.Run("acquire with a command", func(t *testing.T) {
		ctx := testCtx(t)
		cmd, errb, marker := lc.holdWithCommand(ctx, "r/cmd", "5s")
		info, err := cl.Holder(ctx, "r/cmd")
		if err != nil || info.Holder == 0 {
			t.Fatalf("r/cmd: %+v %v", info, err)
		}
		out := lc.ok("release", "-token", strconv.FormatUint(uint64(info.Token), 10), "r/cmd")
		if want := fmt.Sprintf("released r/cmd: revoked session %d, which held it with token %d\n", info.Holder, info.Token); out != want {
			t.Fatalf("release: %q, want %q", out, want)
		}
		err = cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(errb.String(), "stopping the command") || !strings.Contains(errb.String(), "was lost while held") {
			t.Fatalf("acquire after release: %v\n%s", err, errb.String())
		}
		if _, err := os.Stat(marker); err != nil {
			t.Fatalf("command not sent SIGTERM: %v", err)
		}
	})
}

// The script flow release is for: acquire without a command holds the
// lock in the background and prints its token; a later step releases the
// lock with that token. The background acquire then reports the lock lost
// and exits 1, and the next grant has a larger token.
func TestReleaseScriptFlow(t *testing.T) {
	c := newCluster(t, proctest.Options{})
	cl := dial(t, c)
	ctx := testCtx(t)
	o := c.Options()
	dir := t.TempDir()

	// Every wait is bounded (50 polls of 0.1s), and the background acquire
	// is killed on the way out whatever happens.
	const script = `
set -u
ctl() { "$LOCKCTL" -election-timeout "$ET" -timeout 3s "$@"; }
ctl acquire -ttl 2s build-lock > token.txt 2> acquire.err &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
n=0
until [ -s token.txt ]; do
	n=$((n+1))
	if [ $n -gt 50 ] || ! kill -0 $pid 2>/dev/null; then echo "no token" >&2; exit 3; fi
	sleep 0.1
done
ctl locks > locks.txt || exit 4
ctl release -token "$(cat token.txt)" build-lock || exit 5
wait $pid
echo "acquire exited $?"
`
	cmd := exec.CommandContext(ctx, "sh", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"LOCKCTL="+lockctlBin,
		"LOCKCTL_ENDPOINTS="+strings.Join(c.Addrs(), ","),
		"ET="+(time.Duration(o.ElectionTicks)*o.Tick).String(),
	)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("script: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	read := func(name string) string {
		b, err := os.ReadFile(dir + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	tok, err := strconv.ParseUint(strings.TrimSpace(read("token.txt")), 10, 64)
	if err != nil || tok == 0 {
		t.Fatalf("acquire printed %q", read("token.txt"))
	}
	// While it held, the table showed the lock with that token.
	if locks := read("locks.txt"); !strings.Contains(locks, "build-lock") || !strings.Contains(locks, " "+strconv.FormatUint(tok, 10)+" ") {
		t.Fatalf("locks while held:\n%s", locks)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "released build-lock: revoked session ") ||
		!strings.HasSuffix(lines[0], fmt.Sprintf(" which held it with token %d", tok)) || lines[1] != "acquire exited 1" {
		t.Fatalf("script output:\n%s\nstderr:\n%s", out.String(), errb.String())
	}
	if errs := read("acquire.err"); !strings.Contains(errs, fmt.Sprintf(`lock "build-lock" (token %d) was lost while held (its session ended: it expired, or lockctl release or revoke-session revoked it)`, tok)) ||
		strings.Contains(errs, "closing session") {
		t.Fatalf("background acquire's stderr: %q", errs)
	}
	info, err := cl.Holder(ctx, "build-lock")
	if err != nil || info.Holder != 0 {
		t.Fatalf("after the script: %+v %v", info, err)
	}
	s := newSession(t, cl)
	l, err := s.Acquire(ctx, "build-lock")
	if err != nil || uint64(l.Token()) <= tok {
		t.Fatalf("next grant: %v %v (released token %d)", l, err, tok)
	}
	if out := newCtl(t, c).ok("sessions"); strings.Count(out, "\n") != 2 {
		t.Fatalf("sessions: want only the test's own:\n%s", out)
	}
}
