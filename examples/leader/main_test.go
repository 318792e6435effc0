package main

import "testing"

func TestLeaderExample(t *testing.T) {
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
