package main

import (
	"math"
	"runtime"
	"strings"
)

// heapParts attributes the live heap (as of the last GC, from the runtime's
// sampled heap profile, scaled the way pprof scales it) to the part of a
// system that allocated it: the innermost stack frame that belongs to one of
// the given prefixes names the part. Frames of neither count as "other".
//
// It splits the heap delta of memory_1m by the side that allocated it:
// replicas, clients (etcd's, which share the process), the bench's own
// code, other (gRPC, runtime, ...).
func heapParts(parts map[string][]string) map[string]float64 {
	n, _ := runtime.MemProfile(nil, false)
	var recs []runtime.MemProfileRecord
	for {
		recs = make([]runtime.MemProfileRecord, n+64)
		m, ok := runtime.MemProfile(recs, false)
		if ok {
			recs = recs[:m]
			break
		}
		n = m
	}
	rate := float64(runtime.MemProfileRate)
	out := map[string]float64{}
	for _, r := range recs {
		if r.InUseObjects() == 0 {
			continue
		}
		inuse := float64(r.InUseBytes())
		if rate > 1 && r.AllocObjects > 0 {
			avg := float64(r.AllocBytes) / float64(r.AllocObjects)
			inuse /= 1 - math.Exp(-avg/rate)
		}
		out[classify(r.Stack(), parts)] += inuse
	}
	return out
}

func classify(stk []uintptr, parts map[string][]string) string {
	frames := runtime.CallersFrames(stk)
	for {
		f, more := frames.Next()
		for part, prefixes := range parts {
			for _, p := range prefixes {
				if strings.HasPrefix(f.Function, p) {
					return part
				}
			}
		}
		if !more {
			return "other"
		}
	}
}

// Where quorumlock and etcd allocate: the replica side (lock table, raft,
// storage, transport, server) and the client side (sessions, lock handles).
var (
	// quorumlock's memory_1m process holds replicas only (its clients run
	// in a child process), so the root package there is the Node, its gRPC
	// service and its router: replica side too.
	qlReplicaParts = map[string][]string{
		"replica": {
			"github.com/quorumlock/quorumlock/internal/",
			"github.com/quorumlock/quorumlock/raftnode",
			"github.com/quorumlock/quorumlock/storage",
			"github.com/quorumlock/quorumlock/transport",
			"github.com/quorumlock/quorumlock.",
		},
		"bench": {"main."},
	}
	etcdParts = map[string][]string{
		"replica": {"go.etcd.io/etcd/server/", "go.etcd.io/raft/", "go.etcd.io/bbolt"},
		"client":  {"go.etcd.io/etcd/client/"},
		"bench":   {"main."},
	}
)

// heapPartsDelta returns, per part, after[part] - before[part].
func heapPartsDelta(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		out[k] = v - before[k]
	}
	for k, v := range before {
		if _, ok := after[k]; !ok {
			out[k] = -v
		}
	}
	return out
}
