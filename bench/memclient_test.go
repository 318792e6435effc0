package main

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The parent's command line for the memory_1m client process parses back
// to the same configuration.
func TestMemClientArgsRoundTrip(t *testing.T) {
	c := memClientConfig{
		addrs:    []string{"127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003"},
		sessions: 100_000,
		per:      10,
		ttl:      10 * time.Minute,
		workers:  256,
	}
	args := c.args()
	if args[0] != memClientCmd {
		t.Fatalf("args[0] = %q, want %q", args[0], memClientCmd)
	}
	got, err := parseMemClientArgs(args[1:])
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Fatalf("parsed %+v, want %+v", got, c)
	}
}

func TestMemClientArgsInvalid(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-sessions", "10", "-per", "1"},
		{"-addrs", "a:1", "-sessions", "0", "-per", "1"},
		{"-addrs", "a:1", "-sessions", "10", "-per", "1", "extra"},
		{"-addrs", "a:1", "-sessions", "10", "-per", "x"},
		{"-nope"},
	} {
		if c, err := parseMemClientArgs(args); err == nil {
			t.Errorf("parseMemClientArgs(%q) = %+v, want an error", args, c)
		}
	}
}

// Bad arguments end the client process with exit code 2 before it dials.
func TestMemClientMainBadArgs(t *testing.T) {
	var out bytes.Buffer
	if code := memClientMain([]string{"-sessions", "1"}, strings.NewReader(""), &out); code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	if out.Len() != 0 {
		t.Fatalf("wrote %q on stdout", out.String())
	}
}
