package pebblestore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.etcd.io/raft/v3/raftpb"
)

// TestFailureThenCrash fails one kind of file operation while Saves go on,
// then takes what a power loss would leave (only synced data and directory
// entries survive, plus a random part of the rest), both right after the
// failed Save and after Close: each copy must open with every acknowledged
// entry and hard state, and at most the failed Save's entry beyond.
func TestFailureThenCrash(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		fail func(op errorfs.Op) bool
	}{
		{"wal-write", syscall.ENOSPC, func(op errorfs.Op) bool {
			return strings.HasSuffix(op.Path, ".log") && op.Kind == errorfs.OpFileWrite
		}},
		{"wal-sync", syscall.EIO, func(op errorfs.Op) bool {
			return strings.HasSuffix(op.Path, ".log") && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo)
		}},
		{"wal-create", syscall.ENOSPC, func(op errorfs.Op) bool {
			return strings.HasSuffix(op.Path, ".log") && (op.Kind == errorfs.OpCreate || op.Kind == errorfs.OpReuseForWrite)
		}},
		{"table", syscall.ENOSPC, func(op errorfs.Op) bool {
			return strings.HasSuffix(op.Path, ".sst") && (op.Kind == errorfs.OpCreate || op.Kind == errorfs.OpFileWrite)
		}},
		{"manifest-sync", syscall.EIO, func(op errorfs.Op) bool {
			return strings.Contains(op.Path, "MANIFEST") && (op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData)
		}},
		{"dir-sync", syscall.EIO, func(op errorfs.Op) bool {
			return op.Path == "db" && op.Kind == errorfs.OpFileSync
		}},
	} {
		for _, skip := range []int{0, 1, 3} {
			t.Run(fmt.Sprintf("%s/after-%d", c.name, skip), func(t *testing.T) {
				mem := vfs.NewCrashableMem()
				n := 0
				toggle := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
					if c.fail(op) {
						n++
						if n > skip {
							return c.err
						}
					}
					return nil
				})}
				s := openT(t, "db", Options{FS: errorfs.Wrap(mem, toggle)}, defaultCacheLimits)
				saveEach(t, s, 1, 3)
				toggle.On()
				acked, err := saveUntilError(s, 4, 1000)
				if !errors.Is(err, c.err) {
					t.Fatalf("%d acknowledged, then err = %v; want %v", acked, err, c.err)
				}
				rng := rand.New(rand.NewPCG(uint64(skip), 7))
				clones := []*vfs.MemFS{mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rng})}
				_ = s.Close()
				clones = append(clones, mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rng}), mem.CrashClone(vfs.CrashCloneCfg{}))
				for k, fs := range clones {
					s, err := Open("db", Options{FS: fs})
					if err != nil {
						t.Fatalf("clone %d: Open: %v", k, err)
					}
					t.Logf("clone %d", k) // names the clone a failure below is about
					last := checkReopened(t, s, 4, acked)
					if hs, _, err := s.InitialState(); err != nil || hs.GetCommit() < acked {
						t.Fatalf("clone %d: hard state %v, %v; want commit >= %d", k, hs, err, acked)
					}
					if err := s.Save(&raftpb.HardState{Term: new(uint64(1)), Commit: new(last + 1)}, []*raftpb.Entry{bigEntry(last + 1)}); err != nil {
						t.Fatalf("clone %d: Save after reopening: %v", k, err)
					}
					_ = s.Close()
				}
			})
		}
	}
}
