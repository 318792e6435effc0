package crashtest

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// TestReviewCFsyncFailureUnderLoad makes the WAL fsyncs of one replica
// (the leader, or a follower) fail while the workload runs (the leader
// sends its entries before its own fsync, so its followers may commit
// entries it failed to write): the replica must stop with the injected
// error (invariant 10: never retried), the two others must go on serving
// (grants after the failure), and after the failed replica restarts from
// what its file system had synced, every replica must hold exactly what
// the clients were told (nothing the failed replica acknowledged is lost,
// no token issued twice).
func TestReviewCFsyncFailureUnderLoad(t *testing.T) {
	for k, role := range []string{"leader", "follower"} {
		t.Run(role, func(t *testing.T) {
			var failing [4]atomic.Bool
			opt := snapOptions
			opt.wrapFS = func(id uint64, fs vfs.FS) vfs.FS {
				return errorfs.Wrap(fs, errorfs.InjectorFunc(func(op errorfs.Op) error {
					if failing[id].Load() && strings.HasSuffix(op.Path, ".log") &&
						(op.Kind == errorfs.OpFileSync || op.Kind == errorfs.OpFileSyncData || op.Kind == errorfs.OpFileSyncTo) {
						return errorfs.ErrInjected
					}
					return nil
				}))
			}
			c := newCluster(t, opt)
			lead := c.waitLeader()
			w := startWorkload(c, uint64(300+k), clients, locks)
			w.waitOps(40)
			victim := lead.rep.id
			if role == "follower" {
				victim = c.ids[0]
				if victim == lead.rep.id {
					victim = c.ids[1]
				}
			}
			c.mu.Lock()
			l := c.reps[victim].cur
			c.mu.Unlock()
			failing[victim].Store(true)
			c.waitFor(fmt.Sprintf("replica %d to stop on the failed fsync", victim), func() bool {
				select {
				case <-l.node.Done():
					return true
				default:
					return false
				}
			})
			if err := l.node.Err(); err == nil || !strings.Contains(err.Error(), errorfs.ErrInjected.Error()) {
				t.Fatalf("replica %d stopped with %v, want the injected fsync failure", victim, err)
			}
			// The others go on without it.
			before := w.h.now.Load()
			w.waitGrant(fmt.Sprintf("a grant after replica %d stopped", victim), before)
			w.waitOps(30)
			// Restart it from what it had synced, faults off.
			c.crashNow(victim)
			failing[victim].Store(false)
			c.restart([]uint64{victim})
			w.waitOps(40)
			// The victim's stop is expected; any other is a problem.
			c.mu.Lock()
			want := fmt.Sprintf("replica %d, life %d stopped: ", victim, l.n)
			i := slices.IndexFunc(c.fatals, func(f string) bool { return strings.HasPrefix(f, want) })
			if i < 0 {
				c.mu.Unlock()
				t.Fatalf("the victim's stop was not reported: %v", c.fatals)
			}
			c.fatals = slices.Delete(c.fatals, i, i+1)
			c.mu.Unlock()
			commit := w.verify()
			t.Logf("replica %d (%s) stopped on: %v; %d requests answered, %d grants, commit index %d",
				victim, role, l.node.Err(), w.ops.Load(), w.grantCount(), commit)
		})
	}
}
