package main

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

// TestMain runs the command itself when a test starts this binary with
// QUICKSTART_MAIN=1.
func TestMain(m *testing.M) {
	if os.Getenv("QUICKSTART_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// The quickstart is documentation that runs: keep it working.
func TestQuickstart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 5-replica cluster")
	}
	if err := run(); err != nil {
		t.Fatal(err)
	}
}

// Interrupted with Ctrl-C, it still stops its replicas and removes their
// data directory.
func TestQuickstartInterrupted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 5-replica cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tmp := t.TempDir()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "QUICKSTART_MAIN=1", "TMPDIR="+tmp)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if !strings.HasPrefix(line, "1. ") {
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
