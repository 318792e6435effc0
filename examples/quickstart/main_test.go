package main

import (
	"os"
	"testing"

	"github.com/quorumlock/quorumlock/internal/proctest"
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
	proctest.Interrupt(t, "QUICKSTART_MAIN=1", "1. ")
}
