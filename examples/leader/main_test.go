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
// LEADER_MAIN=1.
func TestMain(m *testing.M) {
	if os.Getenv("LEADER_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

func TestLeaderExample(t *testing.T) {
	if err := run(); err != nil {
		t.Fatal(err)
	}
}

// Interrupted with Ctrl-C, it stops (even while campaigning), closes its
// replicas and removes their data directory.
func TestLeaderExampleInterrupted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tmp := t.TempDir()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LEADER_MAIN=1", "TMPDIR="+tmp)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if !strings.HasPrefix(line, "Started 3 replicas") {
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
