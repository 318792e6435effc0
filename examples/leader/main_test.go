package main

import (
	"os"
	"testing"

	"github.com/quorumlock/quorumlock/internal/proctest"
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
	proctest.Interrupt(t, "LEADER_MAIN=1", "Started 3 replicas")
}
