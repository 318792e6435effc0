package quorumlock_test

// Review P: mutation testing of the bad-input checks. Each test here kills
// a mutation of a check (the check removed or weakened) that no earlier
// test caught; the report lists which.

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/storage"
	"github.com/quorumlock/quorumlock/storage/pebblestore"
	"github.com/quorumlock/quorumlock/storage/walstore"
)

// Start refuses every bad Config field with ErrInvalidConfig naming that
// field first ("invalid config: FIELD:"), not a neighbouring field whose
// message happens to mention it, and creates no data directory. Each case
// is one that only its own check catches.
func TestReviewPConfigEveryFieldNamed(t *testing.T) {
	peers := func() map[uint64]string {
		return map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1:2", 3: "127.0.0.1:3"}
	}
	cases := []struct {
		name, field string
		listener    bool
		mutate      func(*quorumlock.Config)
	}{
		// ID 0 is also in Peers: only the ID check names ID.
		{"zero ID listed", "ID", false, func(c *quorumlock.Config) { c.ID = 0; c.Peers[0] = "127.0.0.1:4" }},
		{"no peers", "Peers", false, func(c *quorumlock.Config) { c.Peers = nil }},
		{"member ID 0", "Peers", false, func(c *quorumlock.Config) { c.Peers[0] = "127.0.0.1:4" }},
		// raft reserves the two highest IDs (its local storage threads):
		// Start named the log corrupt instead, after creating DataDir.
		{"ID 2^64-1", "ID", false, func(c *quorumlock.Config) { c.ID = math.MaxUint64; c.Peers[c.ID] = "127.0.0.1:4" }},
		{"ID 2^64-2", "ID", false, func(c *quorumlock.Config) { c.ID = math.MaxUint64 - 1; c.Peers[c.ID] = "127.0.0.1:4" }},
		{"member ID 2^64-1", "Peers", false, func(c *quorumlock.Config) { c.Peers[math.MaxUint64] = "127.0.0.1:4" }},
		{"member ID 2^64-2", "Peers", false, func(c *quorumlock.Config) { c.Peers[math.MaxUint64-1] = "127.0.0.1:4" }},
		{"port above 65535", "Peers", false, func(c *quorumlock.Config) { c.Peers[2] = "127.0.0.1:70000" }},
		{"negative port", "Peers", false, func(c *quorumlock.Config) { c.Peers[2] = "127.0.0.1:-1" }},
		{"another member on port 0", "Peers", true, func(c *quorumlock.Config) { c.Peers[2] = "127.0.0.1:0" }},
		{"own port 0 without Listener", "Peers", false, func(c *quorumlock.Config) { c.Peers[1] = "127.0.0.1:0" }},
		{"unknown backend", "LogBackend", false, func(c *quorumlock.Config) { c.LogBackend = "bogus" }},
		// With a 1 ms tick no election check fires: only the TTL bound does.
		{"TTL below 1s, fast ticks", "SessionTTL", false, func(c *quorumlock.Config) {
			c.SessionTTL, c.TickInterval, c.ElectionTicks = 900*time.Millisecond, time.Millisecond, 3
		}},
		{"negative TTL, fast ticks", "SessionTTL", false, func(c *quorumlock.Config) {
			c.SessionTTL, c.TickInterval, c.ElectionTicks = -time.Second, time.Millisecond, 3
		}},
		{"TTL above 10min", "SessionTTL", false, func(c *quorumlock.Config) { c.SessionTTL = MaxTTLPlus }},
		{"tick below 1ms", "TickInterval", false, func(c *quorumlock.Config) { c.TickInterval = 500 * time.Microsecond }},
		{"negative tick", "TickInterval", false, func(c *quorumlock.Config) { c.TickInterval = -time.Millisecond }},
		{"negative election ticks", "ElectionTicks", false, func(c *quorumlock.Config) { c.ElectionTicks = -5 }},
		{"negative MaxNameBytes", "MaxNameBytes", false, func(c *quorumlock.Config) { c.MaxNameBytes = -1 }},
		{"MaxNameBytes above limit", "MaxNameBytes", false, func(c *quorumlock.Config) { c.MaxNameBytes = quorumlock.MaxNameBytesLimit + 1 }},
		{"negative MaxSessions", "MaxSessions", false, func(c *quorumlock.Config) { c.MaxSessions = -1 }},
		{"negative MaxLocksPerSession", "MaxLocksPerSession", false, func(c *quorumlock.Config) { c.MaxLocksPerSession = -1 }},
		{"negative MaxWaitersPerLock", "MaxWaitersPerLock", false, func(c *quorumlock.Config) { c.MaxWaitersPerLock = -1 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			cfg := quorumlock.Config{ID: 1, Peers: peers(), DataDir: dir}
			if tc.listener {
				cfg.Listener = mustListen(t)
				cfg.Peers[1] = cfg.Listener.Addr().String()
				t.Cleanup(func() { cfg.Listener.Close() })
			}
			tc.mutate(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			n, err := quorumlock.Start(ctx, cfg)
			if err == nil {
				n.Close()
				t.Fatal("Start accepted the config")
			}
			if !errors.Is(err, quorumlock.ErrInvalidConfig) || !strings.Contains(err.Error(), "invalid config: "+tc.field+":") {
				t.Fatalf("error %q: want ErrInvalidConfig naming %s", err, tc.field)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("a rejected config created its data directory (%v)", err)
			}
		})
	}
}

// MaxTTLPlus is just past MaxSessionTTL.
const MaxTTLPlus = quorumlock.MaxSessionTTL + time.Millisecond

// A data directory that holds a log (a hard state, entries) but no
// identity record is refused with ErrForeignDataDir, for both backends:
// Start cannot tell whose log it is, and adopting it could make this
// member vote or apply with another member's state.
func TestReviewPLogWithoutIdentityRefused(t *testing.T) {
	for _, tc := range []struct {
		backend quorumlock.LogBackend
		sub     string
		open    func(dir string) (storage.LogStore, error)
	}{
		{quorumlock.LogPebble, "log", func(dir string) (storage.LogStore, error) { return pebblestore.Open(dir, pebblestore.Options{}) }},
		{quorumlock.LogWAL, "wal", func(dir string) (storage.LogStore, error) { return walstore.Open(dir, walstore.Options{}) }},
	} {
		// A hard state alone, entries alone: either is a log.
		for _, what := range []string{"hard state", "entries"} {
			t.Run(string(tc.backend)+" "+what, func(t *testing.T) {
				data := t.TempDir()
				st, err := tc.open(filepath.Join(data, tc.sub))
				if err != nil {
					t.Fatal(err)
				}
				hs := &raftpb.HardState{Term: proto.Uint64(3), Vote: proto.Uint64(2), Commit: proto.Uint64(0)}
				var ents []*raftpb.Entry
				if what == "entries" {
					hs = &raftpb.HardState{}
					ents = []*raftpb.Entry{{Term: proto.Uint64(3), Index: proto.Uint64(1), Type: raftpb.EntryNormal.Enum()}}
				}
				if err := st.Save(hs, ents); err != nil {
					t.Fatal(err)
				}
				if err := st.Close(); err != nil {
					t.Fatal(err)
				}
				lis := mustListen(t)
				n, err := quorumlock.Start(testCtx(t, 10*time.Second), quorumlock.Config{
					ID: 1, Peers: map[uint64]string{1: lis.Addr().String(), 2: "127.0.0.1:1", 3: "127.0.0.1:2"},
					DataDir: data, Listener: lis, LogBackend: tc.backend,
				})
				if err == nil {
					n.Close()
				}
				if !errors.Is(err, quorumlock.ErrForeignDataDir) {
					t.Fatalf("Start on a log (%s) without identity: %v, want ErrForeignDataDir", what, err)
				}
			})
		}
	}
}

// A numeric port outside 0..65535 (or a negative one) can never be dialled:
// Dial refuses it with ErrInvalidConfig, as it refuses a missing port,
// instead of trying every address until it reports that no replica
// answered. A named port ("http") is still left to the resolver.
func TestReviewPDialPortOutOfRange(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:70000", "127.0.0.1:-1", "dns:///localhost:99999", "[::1]:65536"} {
		cl, err := quorumlock.Dial(testCtx(t, 5*time.Second), []string{addr})
		if !errors.Is(err, quorumlock.ErrInvalidConfig) {
			if cl != nil {
				cl.Close()
			}
			t.Errorf("Dial(%q) = %v, want ErrInvalidConfig", addr, err)
		}
	}
}
