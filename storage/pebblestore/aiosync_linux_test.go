//go:build linux && (amd64 || arm64)

package pebblestore

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/metrics"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
)

// drained checks that a finished sync left nothing behind: no completion
// in the AIO ring (a sync that returned before its request completed
// leaves one), the eventfd's count read (a sync that skipped the parking
// leaves it at 1), and the eventfd still non-blocking (parking through the
// netpoller needs it).
func drained(t *testing.T, a *aioSyncer) {
	t.Helper()
	flags, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(a.efd), syscall.F_GETFL, 0)
	if e != 0 || flags&syscall.O_NONBLOCK == 0 {
		t.Fatalf("eventfd flags %#x (%v): not non-blocking", flags, e)
	}
	var ev ioEvent
	var zero syscall.Timespec
	n, _, e := syscall.Syscall6(syscall.SYS_IO_GETEVENTS, a.ctx, 0, 1, uintptr(unsafe.Pointer(&ev)), uintptr(unsafe.Pointer(&zero)), 0)
	if e != 0 || n != 0 {
		t.Fatalf("after a sync the AIO ring holds %d events (%v), want 0", n, e)
	}
	var b [8]byte
	if _, err := syscall.Read(a.efd, b[:]); err != syscall.EAGAIN {
		t.Fatalf("after a sync the eventfd read gives %v, want EAGAIN (count already taken)", err)
	}
}

// TestOffCPUSyncer: syncs of regular files go through AIO, wait for their
// own completion and succeed without the fallback; a descriptor the kernel
// refuses (a pipe) gets the fallback's result, then the fallback directly;
// after close too; a completion that is not the request's own breaks the
// syncer for good.
func TestOffCPUSyncer(t *testing.T) {
	dir := t.TempDir()
	var files []*os.File
	for i := range 2 {
		f, err := os.Create(filepath.Join(dir, fmt.Sprint("wal", i)))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files = append(files, f)
	}
	s, err := newOffCPUSyncer()
	if err != nil {
		t.Fatalf("newOffCPUSyncer: %v", err)
	}
	a := s.(*aioSyncer)
	fallbacks := 0
	errFallback := errors.New("fallback")
	fallback := func() error { fallbacks++; return errFallback }
	for i := range 200 {
		f := files[i%2]
		if _, err := f.Write([]byte("record")); err != nil {
			t.Fatal(err)
		}
		if err := s.syncData(int(f.Fd()), fallback); err != nil || fallbacks != 0 {
			t.Fatalf("sync %d of a regular file: %v, %d fallbacks", i, err, fallbacks)
		}
		drained(t, a)
	}

	// A request nobody waits for, queued behind the syncer's back: its
	// completion must not pass for the next sync's. It signals an eventfd
	// of its own, and the syncs start once it has completed (a kernel
	// worker may run it after later requests: CI under load once saw two
	// syncs finish first).
	orphanDone, _, e := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC, 0)
	if e != 0 {
		t.Fatal(e)
	}
	defer syscall.Close(int(orphanDone))
	orphan := iocb{data: 1 << 60, opcode: iocbCmdFdsync, fildes: uint32(files[0].Fd()), flags: iocbFlagResfd, resfd: uint32(orphanDone)}
	cbs := [1]*iocb{&orphan}
	if _, _, e := syscall.Syscall(syscall.SYS_IO_SUBMIT, a.ctx, 1, uintptr(unsafe.Pointer(&cbs[0]))); e != 0 {
		t.Fatal(e)
	}
	var count [8]byte
	if _, err := syscall.Read(int(orphanDone), count[:]); err != nil {
		t.Fatalf("waiting for the orphan request: %v", err)
	}
	var errs []error
	for range 2 {
		errs = append(errs, s.syncData(int(files[1].Fd()), fallback))
	}
	if errs[1] == nil || (errs[0] != nil && errs[0] != errs[1]) {
		t.Fatalf("syncs after an orphan completion: %v; want an error, and the same error from then on", errs)
	}

	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if err := s.close(); err != nil {
		t.Fatalf("second close: %v", err)
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	ps, err := newOffCPUSyncer()
	if err != nil {
		t.Fatal(err)
	}
	fallbacks = 0
	if err := ps.syncData(int(w.Fd()), fallback); !errors.Is(err, errFallback) || fallbacks != 1 {
		t.Fatalf("sync of a pipe: %v, %d fallbacks; want the fallback's result once", err, fallbacks)
	}
	if !ps.(*aioSyncer).disabled {
		t.Fatal("a refused request did not switch the syncer to its fallback")
	}
	if err := ps.syncData(int(files[0].Fd()), fallback); !errors.Is(err, errFallback) || fallbacks != 2 {
		t.Fatalf("sync after a refusal: %v, %d fallbacks; want the fallback", err, fallbacks)
	}
	if err := ps.close(); err != nil {
		t.Fatal(err)
	}
	if err := ps.syncData(int(files[0].Fd()), fallback); !errors.Is(err, errFallback) || fallbacks != 3 {
		t.Fatalf("sync after close: %v, %d fallbacks; want the fallback", err, fallbacks)
	}
}

func TestAIOResult(t *testing.T) {
	if err := aioResult(0); err != nil {
		t.Fatalf("res 0: %v", err)
	}
	if err := aioResult(-int64(syscall.EIO)); !errors.Is(err, syscall.EIO) {
		t.Fatalf("res -EIO: %v, want EIO", err)
	}
}

// storeFDs returns this process's open descriptors that a store in dir
// may hold, by number with what each refers to: files under dir and
// eventfds (the off-processor syncer's). Descriptors of anything else are
// left out: another test's store may still be closing one in the
// background (CI under load once saw the count drop by one).
func storeFDs(t *testing.T, dir string) map[string]string {
	t.Helper()
	if d, err := filepath.EvalSymlinks(dir); err == nil {
		dir = d
	}
	des, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	fds := make(map[string]string)
	for _, de := range des {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", de.Name()))
		if err != nil {
			continue // closed meanwhile (the ReadDir's own, for one)
		}
		if target == "anon_inode:[eventfd]" || strings.HasPrefix(target, dir+string(filepath.Separator)) || target == dir {
			fds[de.Name()] = target
		}
	}
	return fds
}

// TestWALSyncsOffCPU: under scheduling pressure the WAL's syncs wait off
// the processor, through new and recycled WAL files, what they wrote is all
// there after a crash image (of the page cache: this shows the records
// reach the files, not that they are durable) and a reopen, and a store's
// open and close cycles leak no descriptor.
func TestWALSyncsOffCPU(t *testing.T) {
	dir := t.TempDir()
	fds := storeFDs(t, dir)
	s := openT(t, dir, Options{Logger: zap.NewNop()}, defaultCacheLimits)
	defer s.Close()
	if s.syncs == nil {
		t.Fatal("a store on the operating system's file system has no walSyncs")
	}
	f := newFakeSchedLatency()
	s.syncs.pressure.setSample(func() *metrics.Float64Histogram {
		f.add(4, 100) // every read sees a window of 1 ms waits
		return f.sample()
	})
	hs := func(commit uint64) *raftpb.HardState {
		return &raftpb.HardState{Term: new(uint64(1)), Vote: new(uint64(1)), Commit: new(commit)}
	}
	save := func(lo, hi uint64) {
		t.Helper()
		before := s.syncs.offCPU.Load()
		for i := lo; i <= hi; i++ {
			if err := s.Save(hs(i-1), testEntries(i, i, 1)); err != nil {
				t.Fatal(err)
			}
		}
		if n := s.syncs.offCPU.Load() - before; n < (hi-lo+1)/2 {
			t.Fatalf("entries %d-%d: %d synced Saves waited off the processor under pressure (blocked: %d)", lo, hi, n, s.syncs.blocked.Load())
		}
	}
	check := func(dir string, last uint64) {
		t.Helper()
		r := openT(t, dir, Options{Logger: zap.NewNop()}, defaultCacheLimits)
		defer r.Close()
		ents, err := r.Entries(1, last+1, math.MaxUint64)
		if err != nil || len(ents) != int(last) {
			t.Fatalf("reopened %s: %d entries, %v; want %d", dir, len(ents), err, last)
		}
		for i, e := range ents {
			if want := fmt.Sprintf("entry %d", i+1); e.GetIndex() != uint64(i+1) || string(e.GetData()) != want {
				t.Fatalf("reopened: entry %d is %v", i+1, e)
			}
		}
	}
	save(1, 100)
	check(crashImage(t, dir), 100)

	// Rotations: the first makes a new WAL file, later ones recycle old
	// ones (ReuseForWrite).
	last := uint64(100)
	for range 3 {
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
		save(last+1, last+50)
		last += 50
	}
	check(crashImage(t, dir), last)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	check(dir, last)
	for fd, target := range storeFDs(t, dir) {
		if fds[fd] != target {
			t.Errorf("descriptor %s (%s) still open after the store closed", fd, target)
		}
	}
}
