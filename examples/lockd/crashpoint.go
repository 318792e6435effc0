//go:build crashpoint

package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/testhook"
)

// A lockd built with the tag crashpoint (verify's multi-process mode, fault
// crash-point) can be told to kill itself with SIGKILL at a point of its
// raft Ready loop: started with QUORUMLOCK_CRASH_FILE=path, on SIGUSR1 it
// reads "point:n" from that file and dies the n-th time it passes point
// from then on (point: before-save, after-save, after-send, after-apply,
// before-snapshot-save, after-snapshot-save; raftnode's failpoints). Never
// ship such a build.
func init() {
	file := os.Getenv("QUORUMLOCK_CRASH_FILE")
	if file == "" {
		return
	}
	type armed struct {
		point  string
		n      int64
		passes atomic.Int64
	}
	var cur atomic.Pointer[armed]
	hook := func(p string) {
		a := cur.Load()
		if a == nil || p != a.point || a.passes.Add(1) != a.n {
			return
		}
		fmt.Fprintf(os.Stderr, "lockd: crash point %s reached (pass %d): SIGKILL\n", p, a.n)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way: go no further
	}
	configHooks = append(configHooks, func(cfg *quorumlock.Config) { testhook.SetFailpoint(cfg, hook) })
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	go func() {
		for range sig {
			b, err := os.ReadFile(file)
			spec := strings.TrimSpace(string(b))
			point, nStr, ok := strings.Cut(spec, ":")
			n, perr := strconv.ParseInt(nStr, 10, 64)
			if err != nil || !ok || perr != nil || n < 1 {
				fmt.Fprintf(os.Stderr, "lockd: bad crash point %q in %s: %v\n", spec, file, err)
				continue
			}
			fmt.Fprintf(os.Stderr, "lockd: crash point armed: %s, pass %d\n", point, n)
			cur.Store(&armed{point: point, n: n})
		}
	}()
}
