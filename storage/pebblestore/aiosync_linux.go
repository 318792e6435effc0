//go:build linux && (amd64 || arm64)

package pebblestore

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// Linux AIO ABI (include/uapi/linux/aio_abi.h), little-endian 64-bit layout.
const (
	iocbCmdFdsync = 3 // IOCB_CMD_FDSYNC: fdatasync, run by a kernel worker (Linux 4.18+)
	iocbFlagResfd = 1 // IOCB_FLAG_RESFD: signal aio_resfd on completion
)

// iocb is struct iocb (64 bytes).
type iocb struct {
	data      uint64
	key       uint32
	rwFlags   uint32
	opcode    uint16
	reqprio   int16
	fildes    uint32
	buf       uint64
	nbytes    uint64
	offset    int64
	reserved2 uint64
	flags     uint32
	resfd     uint32
}

// ioEvent is struct io_event (32 bytes).
type ioEvent struct {
	data uint64
	obj  uint64
	res  int64 // the fdatasync result: 0, or -errno
	res2 int64
}

// aioSyncer runs fdatasync(2) on one file as a Linux AIO request
// (IOCB_CMD_FDSYNC) whose completion signals an eventfd, and waits for the
// eventfd through the Go netpoller. The kernel performs the same vfs_fsync
// as fdatasync(2), in a worker thread; the calling goroutine is parked, so
// its processor runs other goroutines meanwhile (see syncPressure for why
// that matters).
//
// One request is in flight at a time. The syncer does not own the file
// descriptor it syncs; close releases the AIO context and the eventfd.
type aioSyncer struct {
	mu       sync.Mutex
	fd       int      // the file to sync
	ctx      uintptr  // aio_context_t, one slot
	efd      int      // eventfd signalled on completion (non-blocking)
	ev       *os.File // efd, registered with the netpoller
	disabled bool     // io_submit refused the file: fdatasync from now on
	closed   bool
}

func newOffCPUSyncer(fd uintptr) (offCPUSyncer, error) {
	var ctx uintptr
	if _, _, e := syscall.Syscall(syscall.SYS_IO_SETUP, 1, uintptr(unsafe.Pointer(&ctx)), 0); e != 0 {
		return nil, fmt.Errorf("io_setup: %w", e)
	}
	efd, _, e := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if e != 0 {
		syscall.Syscall(syscall.SYS_IO_DESTROY, ctx, 0, 0)
		return nil, fmt.Errorf("eventfd2: %w", e)
	}
	// os.NewFile registers a non-blocking descriptor with the netpoller, so
	// a Read parks the goroutine instead of blocking its thread. The number
	// is kept apart: (*os.File).Fd would switch the descriptor to blocking.
	return &aioSyncer{fd: int(fd), ctx: ctx, efd: int(efd), ev: os.NewFile(efd, "quorumlock-wal-sync")}, nil
}

// syncData makes the file's written data durable, like fdatasync(2). If the
// kernel refuses the request before queueing it (a file system without
// fsync support for AIO, resource limits), it returns fallback() instead,
// and after a refusal other than EAGAIN it uses fallback from then on. Once
// a request is queued, syncData waits for its completion whatever happens,
// and returns the kernel's result: an fsync error is never retried or
// hidden (a retried fsync can report success for data the failed one lost).
func (a *aioSyncer) syncData(fallback func() error) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.disabled || a.closed {
		return fallback()
	}
	cb := iocb{opcode: iocbCmdFdsync, fildes: uint32(a.fd), flags: iocbFlagResfd, resfd: uint32(a.efd)}
	cbs := [1]*iocb{&cb}
	for {
		n, _, e := syscall.Syscall(syscall.SYS_IO_SUBMIT, a.ctx, 1, uintptr(unsafe.Pointer(&cbs[0])))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 || n != 1 {
			// Nothing was queued: the file is synced the ordinary way.
			if e != syscall.EAGAIN {
				a.disabled = true
			}
			return fallback()
		}
		break
	}
	// Park until the kernel signals completion. A failed read (which a
	// healthy eventfd never returns) only loses the parking: io_getevents
	// below blocks until the request completes.
	var count [8]byte
	_, _ = a.ev.Read(count[:])
	var ev ioEvent
	for {
		n, _, e := syscall.Syscall6(syscall.SYS_IO_GETEVENTS, a.ctx, 1, 1, uintptr(unsafe.Pointer(&ev)), 0, 0)
		if e == syscall.EINTR || (e == 0 && n == 0) {
			continue
		}
		if e != 0 {
			// The request's outcome is unknown: report a failed sync.
			return fmt.Errorf("pebblestore: io_getevents after an fdatasync request: %w", e)
		}
		break
	}
	if ev.res < 0 {
		return &os.PathError{Op: "fdatasync (aio)", Path: fmt.Sprintf("fd %d", a.fd), Err: syscall.Errno(-ev.res)}
	}
	return nil
}

// close releases the AIO context and the eventfd. It waits for a sync in
// progress.
func (a *aioSyncer) close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	err := a.ev.Close()
	if _, _, e := syscall.Syscall(syscall.SYS_IO_DESTROY, a.ctx, 0, 0); e != 0 {
		err = errors.Join(err, fmt.Errorf("io_destroy: %w", e))
	}
	return err
}
