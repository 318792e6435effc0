package storagetest

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/quorumlock/quorumlock/storage"
)

// killDirEnv tells a re-executed test binary to act as the writer of
// testKillDuringWrites in the directory it names (Run calls killChild).
const killDirEnv = "QUORUMLOCK_STORAGETEST_KILL_DIR"

// Writes of the child, one line each on stdout, printed after the write
// returned: "save N" (entries through N and a hard state committing N),
// "snap N" (a snapshot at N) and "compact N".
const (
	killSnapEvery = 23
	killTail      = 15
)

// testKillDuringWrites runs a writer in a child process that saves entries
// one Save at a time, takes a snapshot every few entries and compacts behind
// it, and prints each write after it returns. The parent kills the child with
// SIGKILL after a random number of writes (so the kill lands at a random
// point of a later write, possibly mid-record), reopens the store and checks
// that every write the child printed is there and the log is consistent.
// The next child continues on the same directory, so recovery is repeated.
//
// SIGKILL keeps what the kernel already accepted, so this tests a process
// crash, not a power loss; backends test lost unsynced writes with their own
// fault-injecting file systems.
func testKillDuringWrites(t *testing.T, h *harness) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	dir := h.dir + "-kill"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var elems []string
	for _, e := range strings.Split(t.Name(), "/") {
		elems = append(elems, "^"+regexp.QuoteMeta(e)+"$")
	}
	pattern := strings.Join(elems, "/")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))

	// The children's temporary directory: whatever a killed child leaves
	// there is removed with the parent's, and must be nothing.
	childTmp := t.TempDir()

	var acked killState
	for round := range 3 {
		n := 20 + rng.IntN(120)
		got := runKillChild(t, pattern, dir, childTmp, n)
		if left, _ := os.ReadDir(childTmp); len(left) > 0 {
			t.Errorf("the killed writer left %d entries in its temporary directory, first %s", len(left), left[0].Name())
		}
		acked.merge(got)
		t.Logf("round %d: killed after %d writes; acknowledged: save %d, snapshot %d, compact %d",
			round, n, acked.saved, acked.snap, acked.compacted)

		s := h.open(t, dir)
		checkAfterKill(t, s, acked)
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
}

// killState is what the child acknowledged.
type killState struct {
	saved, snap, compacted uint64
	writes                 int
}

func (k *killState) merge(o killState) {
	k.saved = max(k.saved, o.saved)
	k.snap = max(k.snap, o.snap)
	k.compacted = max(k.compacted, o.compacted)
}

// runKillChild starts the writer (with tmp as its TMPDIR), reads its acknowledgements until it made n
// writes, kills it and returns what it acknowledged.
func runKillChild(t *testing.T, pattern, dir, tmp string, n int) killState {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run="+pattern, "-test.count=1")
	cmd.Env = append(os.Environ(), killDirEnv+"="+dir, "TMPDIR="+tmp)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var got killState
	var other []string
	sc := bufio.NewScanner(out)
	for got.writes < n && sc.Scan() {
		var what string
		var i uint64
		if _, err := fmt.Sscanf(sc.Text(), "%s %d", &what, &i); err != nil {
			other = append(other, sc.Text())
			continue
		}
		switch what {
		case "save":
			got.saved = i
		case "snap":
			got.snap = i
		case "compact":
			got.compacted = i
		default:
			other = append(other, sc.Text())
			continue
		}
		got.writes++
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if got.writes < n {
		t.Fatalf("writer stopped after %d of %d writes; output:\n%s\nstderr:\n%s",
			got.writes, n, strings.Join(other, "\n"), stderr.String())
	}
	return got
}

// killChild is the writer. It never returns normally: the parent kills it.
func killChild(t *testing.T, open func(t *testing.T, dir string) storage.LogStore, dir string) {
	s := open(t, dir)
	last, err := s.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	snapData := bytes.Repeat([]byte("lock table "), 3000)
	for i := last + 1; ; i++ {
		if err := s.Save(hardState(1, 1, i), []*raftpb.Entry{entry(i, 1)}); err != nil {
			t.Fatalf("Save(%d): %v", i, err)
		}
		fmt.Printf("save %d\n", i)
		if i%killSnapEvery != 0 {
			continue
		}
		snap := snapshot(i, 1, []uint64{1, 2, 3}, "")
		snap.Data = append(fmt.Appendf(nil, "state at %d ", i), snapData...)
		if err := s.SaveSnapshot(snap); err != nil {
			t.Fatalf("SaveSnapshot(%d): %v", i, err)
		}
		fmt.Printf("snap %d\n", i)
		if err := s.Compact(i - killTail); err != nil {
			t.Fatalf("Compact(%d): %v", i-killTail, err)
		}
		fmt.Printf("compact %d\n", i-killTail)
	}
}

// checkAfterKill checks the reopened store against what the child
// acknowledged: nothing acknowledged is missing, and what is there is
// consistent (the snapshot within the log, entries intact, the commit index
// within the log).
func checkAfterKill(t *testing.T, s storage.LogStore, acked killState) {
	t.Helper()
	first, err := s.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	if last < acked.saved {
		t.Fatalf("LastIndex() = %d after the kill; entries through %d were acknowledged", last, acked.saved)
	}
	if first-1 < acked.compacted {
		t.Fatalf("FirstIndex() = %d after the kill; compaction through %d was acknowledged", first, acked.compacted)
	}
	hs, _, err := s.InitialState()
	if err != nil {
		t.Fatal(err)
	}
	if hs.GetCommit() < acked.saved || hs.GetCommit() > last {
		t.Fatalf("hard state commit %d after the kill; want in [%d, %d]", hs.GetCommit(), acked.saved, last)
	}
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	si := snap.GetMetadata().GetIndex()
	if si < acked.snap || si < first-1 || si > last {
		t.Fatalf("snapshot at %d after the kill; want at least %d and within the log [%d, %d]", si, acked.snap, first-1, last)
	}
	if si > 0 && !bytes.HasPrefix(snap.GetData(), fmt.Appendf(nil, "state at %d ", si)) {
		t.Fatalf("snapshot at %d carries the data of another snapshot", si)
	}
	if last < first {
		return
	}
	ents, err := s.Entries(first, last+1, noLimit)
	if err != nil {
		t.Fatalf("Entries(%d, %d): %v", first, last+1, err)
	}
	var want []*raftpb.Entry
	for i := first; i <= last; i++ {
		want = append(want, entry(i, 1))
	}
	checkEntries(t, "Entries after the kill", ents, want)
}
