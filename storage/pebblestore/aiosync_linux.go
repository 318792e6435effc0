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
	data uint64 // the request's iocb.data
	obj  uint64
	res  int64 // the fdatasync result: 0, or -errno
	res2 int64
}

// aioSyncer runs fdatasync(2) as a Linux AIO request (IOCB_CMD_FDSYNC)
// whose completion signals an eventfd, and waits for the eventfd through
// the Go netpoller. The kernel performs the same vfs_fsync as fdatasync(2),
// in a worker thread; the calling goroutine is parked, so its processor
// runs other goroutines meanwhile (see syncwait.go for why that matters).
//
// One request is in flight at a time, tagged with a sequence number that
// its completion must carry. A store makes one aioSyncer, at its first sync
// under pressure, and closes it after Pebble (closing costs an RCU grace
// period, tens of milliseconds, so it is not done per WAL file).
type aioSyncer struct {
	mu       sync.Mutex
	ctx      uintptr  // aio_context_t, one slot
	efd      int      // eventfd signalled on completion (non-blocking)
	ev       *os.File // efd, registered with the netpoller
	seq      uint64   // tag of the last request
	disabled bool     // io_submit refused a file: fdatasync from now on
	broken   error    // a request's outcome is unknown: every sync fails
	closed   bool
}

func newOffCPUSyncer() (offCPUSyncer, error) {
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
	return &aioSyncer{ctx: ctx, efd: int(efd), ev: os.NewFile(efd, "quorumlock-wal-sync")}, nil
}

// syncData makes the written data of file descriptor fd durable, like
// fdatasync(2). If the kernel refuses the request before queueing it (a
// file without AIO fsync support, resource limits), it returns fallback()
// instead, and after a refusal other than EAGAIN it uses fallback from then
// on. Once a request is queued, syncData waits for that request's
// completion and returns the kernel's result: an fsync error is never
// retried or hidden (a retried fsync can report success for data the failed
// one lost). If the outcome cannot be known, syncData and every later call
// return an error.
func (a *aioSyncer) syncData(fd int, fallback func() error) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.broken != nil {
		return a.broken
	}
	if a.disabled || a.closed {
		return fallback()
	}
	a.seq++
	cb := iocb{data: a.seq, opcode: iocbCmdFdsync, fildes: uint32(fd), flags: iocbFlagResfd, resfd: uint32(a.efd)}
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
			a.broken = fmt.Errorf("pebblestore: the outcome of an fdatasync request is unknown: io_getevents: %w", e)
			return a.broken
		}
		break
	}
	if ev.data != a.seq {
		// Only one request is ever in flight, so this is a completion
		// nobody waited for, and this request's own is still to come.
		a.broken = fmt.Errorf("pebblestore: fdatasync request %d completed as request %d", a.seq, ev.data)
		return a.broken
	}
	return aioResult(ev.res)
}

// aioResult is the error an io_event's res stands for.
func aioResult(res int64) error {
	if res < 0 {
		return &os.SyscallError{Syscall: "fdatasync (aio)", Err: syscall.Errno(-res)}
	}
	return nil
}

// close releases the AIO context and the eventfd. It waits for a sync in
// progress; later syncs use their fallback.
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
