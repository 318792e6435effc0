package main

import "testing"

// The quickstart is documentation that runs: keep it working.
func TestQuickstart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 5-replica cluster")
	}
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
