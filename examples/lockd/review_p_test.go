package main

// Review P: lockd's flag checks, each killed as a mutation: a bad or
// missing flag exits with status 2 (a usage or configuration error) and a
// message naming the flag, before any data directory is made.

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReviewPBadFlagsExit2NamingTheFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string // -data is added, and -id and -peers unless given
		want string
	}{
		{"no -id", []string{"-peers", "1=127.0.0.1:1"}, "-id"},
		{"no -peers", []string{"-id", "1"}, "-peers"},
		{"no -data", []string{"-data", ""}, "-data"},
		{"negative -ttl", []string{"-ttl", "-1s"}, "-ttl"},
		{"negative -tick", []string{"-tick", "-1ms"}, "-tick"},
		{"negative -election-ticks", []string{"-election-ticks", "-3"}, "-election-ticks"},
		// Caught by Start (ErrInvalidConfig): still a configuration error.
		{"-ttl above 10m", []string{"-ttl", "11m"}, "SessionTTL"},
		{"-tick below 1ms", []string{"-tick", "500us"}, "TickInterval"},
		{"-id not in -peers", []string{"-id", "2", "-peers", "1=127.0.0.1:1"}, "ID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := filepath.Join(t.TempDir(), "d")
			args := []string{"-data", data, "-log-level", "error"}
			has := func(f string) bool {
				for _, a := range tc.args {
					if a == f {
						return true
					}
				}
				return false
			}
			if !has("-id") && !has("-peers") {
				args = append(args, "-id", "1", "-peers", "1=127.0.0.1:1")
			}
			args = append(args, tc.args...)
			var stderr bytes.Buffer
			if code := run(args, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("lockd %q: exit %d, stderr %q; want 2 naming %s", tc.args, code, stderr.String(), tc.want)
			}
			if _, err := os.Stat(data); !os.IsNotExist(err) {
				t.Fatalf("a refused configuration made its data directory (%v)", err)
			}
		})
	}
}
