package quorumlock

import (
	"sync/atomic"
	"testing"

	"github.com/quorumlock/quorumlock/clock"
)

// Background work started while the Node or Client is open is waited for
// at Close; once it is closing, nothing more starts (a Leadership or
// Session ending concurrently with Close would otherwise start a goroutine
// after Close's wait, which nobody waits for).
func TestHeartbeaterBackgroundAfterClose(t *testing.T) {
	closed := make(chan struct{})
	h := newHeartbeater(nil, clock.Real(), closed)
	var ran atomic.Int32
	release := make(chan struct{})
	h.background(func() {
		<-release
		ran.Add(1)
	})
	close(closed)
	close(release)
	h.wait()
	if ran.Load() != 1 {
		t.Fatal("wait returned before the background work started while open")
	}
	h.background(func() { ran.Add(1) })
	h.wait()
	if ran.Load() != 1 {
		t.Fatal("background work started after the heartbeater was closed")
	}
}
