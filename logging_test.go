package quorumlock_test

import (
	"net"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/quorumlock/quorumlock"
)

// Every log entry names its member once: the transport added a second
// "member" field to the node's logger, which already had one (duplicate
// keys in JSON logs).
func TestLogFieldsNotRepeated(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	n, err := quorumlock.Start(testCtx(t, 5*time.Second), quorumlock.Config{
		ID:       1,
		Peers:    map[uint64]string{1: lis.Addr().String(), 2: "127.0.0.1:1", 3: "127.0.0.1:2"},
		DataDir:  t.TempDir(),
		Listener: lis,
		Logger:   zap.New(core),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	// The peers refuse connections: the transport logs that.
	deadline := time.Now().Add(10 * time.Second)
	for logs.FilterMessageSnippet("peer stream").Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no log entry of the transport")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, e := range logs.All() {
		seen := map[string]bool{}
		for _, f := range e.Context {
			if seen[f.Key] {
				t.Fatalf("field %q twice in %q: %v", f.Key, e.Message, e.Context)
			}
			seen[f.Key] = true
		}
	}
}
