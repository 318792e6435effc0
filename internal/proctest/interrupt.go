package proctest

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Interrupt runs the test binary again as an example program (the test's
// TestMain runs main when env, "NAME=1", is set), with TMPDIR pointing at
// a fresh directory, waits for its first line to start with firstLine,
// sends it SIGINT (Ctrl-C), and fails t unless the program then stops
// within 30 s and leaves nothing in TMPDIR (it closed its replicas and
// removed their data directory).
func Interrupt(t *testing.T, env, firstLine string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tmp := t.TempDir()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env, "TMPDIR="+tmp)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if !strings.HasPrefix(line, firstLine) {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("first line %q %v", line, err)
	}
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); ctx.Err() != nil {
		t.Fatalf("not stopped by SIGINT: %v", err)
	}
	left, err := os.ReadDir(tmp)
	if err != nil || len(left) != 0 {
		t.Fatalf("left behind in TMPDIR: %v %v", left, err)
	}
}
