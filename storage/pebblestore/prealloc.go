package pebblestore

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// walSizingFS hands Pebble write-ahead log files whose Preallocate extends
// the file's size, not only its blocks.
//
// Pebble preallocates each WAL (110% of the memtable size) with
// FALLOC_FL_KEEP_SIZE, so until a WAL file is recycled every append still
// grows the file and every fdatasync must also commit the new inode size
// through the filesystem journal. On this project's ext4 test machine that
// makes a small synced append cost 0.22 ms instead of 0.16 ms (a raft log
// store syncs once per Ready, so the difference is on every commit's path).
// etcd's WAL avoids it the same way: it preallocates 64 MiB segments with
// fallocate mode 0 (server/storage/wal, fileutil.Preallocate with
// extendFile). Pebble's reader already expects a zero tail: a recycled or
// preallocated WAL ends in zeros or stale chunks after its last record, which
// replay treats as the end of the log (open.go, replayWAL), and checkWALTail
// considers only chunks carrying the file's own log number.
//
// Files that are not WALs, and files without a descriptor (vfs.NewMem), keep
// the wrapped file system's Preallocate.
//
// With syncs, WAL files also sync off the processor while goroutines wait
// for processors (syncwait.go).
//
// A WAL file that cannot be created or reused (ENOSPC, EMFILE, EIO) is
// reported through onWALError and handed to Pebble as a deadWAL; see there.
type walSizingFS struct {
	vfs.FS
	syncs *walSyncs // nil: WAL syncs always block in SyncData

	// onWALError records a failure of a WAL file (to be created or reused,
	// written, synced or closed) as the store's sticky error. Nil: the
	// failure is returned to Pebble.
	onWALError func(error)
	// failed returns the store's sticky error, or nil while it is healthy;
	// used only with onWALError.
	failed func() error
}

func isWAL(name string) bool { return strings.HasSuffix(name, ".log") }

func (fs walSizingFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	if isWAL(name) && fs.onWALError != nil {
		if err := fs.failed(); err != nil {
			// No new WAL after a failure: the one written last must stay
			// the newest, where Pebble takes a torn tail for the end of
			// the log (it refuses one in an older WAL).
			return fs.deadWAL("create", name, err)
		}
	}
	f, err := fs.FS.Create(name, category)
	if !isWAL(name) {
		return f, err
	}
	if err != nil {
		return fs.deadWAL("create", name, err)
	}
	return fs.wrapWAL(name, f), nil
}

func (fs walSizingFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	if isWAL(newname) && fs.onWALError != nil {
		if err := fs.failed(); err != nil {
			return fs.deadWAL("reuse "+oldname+" as", newname, err)
		}
	}
	f, err := fs.FS.ReuseForWrite(oldname, newname, category)
	if !isWAL(newname) {
		return f, err
	}
	if err != nil {
		return fs.deadWAL("reuse "+oldname+" as", newname, err)
	}
	return fs.wrapWAL(newname, f), nil
}

// deadWAL handles a WAL file that could not be opened. Pebble opens the
// next WAL while it switches memtables, inside a commit, and panics when
// that fails (DB.rotateWAL), with its mutex released so that the panic
// becomes an unrecoverable "unlock of unlocked mutex": a full disk or a
// process out of file descriptors would kill the whole process, every
// replica in it. So the failure is recorded as the store's sticky error,
// and Pebble gets a stand-in whose every write and sync fails with it: the
// commit that switched fails, no write is acknowledged after it, and the
// replica stops. Nothing ever reaches the missing file, so a restart finds
// no trace of it.
func (fs walSizingFS) deadWAL(op, name string, err error) (vfs.File, error) {
	if fs.onWALError == nil {
		return nil, err
	}
	err = fmt.Errorf("%s WAL %s: %w", op, name, err)
	fs.onWALError(err)
	return deadWALFile{name: fs.PathBase(name), err: err}, nil
}

// walFile is a WAL file whose write, sync and close failures go to the
// store (onErr records the sticky error, which also fences the files) and
// not to Pebble, which sees them succeed.
//
// Pebble panics, in a way no recover catches, when closing the previous WAL
// fails while it switches memtables inside a commit (DB.rotateWAL). That
// close writes what is still queued (the EOF trailer; for a batch larger
// than half a memtable, such as a big snapshot, the whole batch, which
// Pebble writes to the old WAL before switching) and syncs it: on a nearly
// full disk, saving a large snapshot killed the process. Hiding the failure
// is safe because the store never acknowledges a write once it has failed:
// the store writes one synced batch at a time, so everything before the
// commit in flight is already durable, and Store.write checks the sticky
// error after the commit's sync returns.
//
// Once the store has failed (this file's failure or any other), writes and
// syncs are dropped: the WAL stays as the failure left it, as a crash
// would leave it, with no later block written at an offset a short write
// moved. And no WAL is created after a failure (walSizingFS.Create), so
// this one stays the newest, the only one whose torn tail Pebble accepts.
type walFile struct {
	vfs.File
	name   string
	onErr  func(error)
	failed func() error
}

func (f walFile) fail(op string, err error) {
	f.onErr(fmt.Errorf("%s WAL %s: %w", op, f.name, err))
}

func (f walFile) Write(p []byte) (int, error) {
	if f.failed() == nil {
		if _, err := f.File.Write(p); err != nil {
			f.fail("write", err)
		}
	}
	return len(p), nil
}

func (f walFile) WriteAt(p []byte, off int64) (int, error) {
	if f.failed() == nil {
		if _, err := f.File.WriteAt(p, off); err != nil {
			f.fail("write", err)
		}
	}
	return len(p), nil
}

func (f walFile) Sync() error {
	if f.failed() == nil {
		if err := f.File.Sync(); err != nil {
			f.fail("sync", err)
		}
	}
	return nil
}

func (f walFile) SyncData() error {
	if f.failed() == nil {
		if err := f.File.SyncData(); err != nil {
			f.fail("sync", err)
		}
	}
	return nil
}

func (f walFile) SyncTo(length int64) (bool, error) {
	if f.failed() != nil {
		return true, nil
	}
	full, err := f.File.SyncTo(length)
	if err != nil {
		f.fail("sync", err)
		return true, nil
	}
	return full, nil
}

func (f walFile) Close() error {
	if err := f.File.Close(); err != nil {
		f.fail("close", err)
	}
	return nil
}

// deadWALFile is the stand-in for a WAL file that could not be opened:
// every read, write and sync fails with err. Stat succeeds (an empty file),
// as Pebble's WAL manager requires of a reused file.
type deadWALFile struct {
	name string
	err  error
}

func (f deadWALFile) Close() error                       { return nil }
func (f deadWALFile) Read([]byte) (int, error)           { return 0, f.err }
func (f deadWALFile) ReadAt([]byte, int64) (int, error)  { return 0, f.err }
func (f deadWALFile) Write([]byte) (int, error)          { return 0, f.err }
func (f deadWALFile) WriteAt([]byte, int64) (int, error) { return 0, f.err }
func (f deadWALFile) Preallocate(int64, int64) error     { return f.err }
func (f deadWALFile) Stat() (vfs.FileInfo, error)        { return deadWALInfo{name: f.name}, nil }
func (f deadWALFile) Sync() error                        { return f.err }
func (f deadWALFile) SyncTo(int64) (bool, error)         { return false, f.err }
func (f deadWALFile) SyncData() error                    { return f.err }
func (f deadWALFile) Prefetch(int64, int64) error        { return nil }
func (f deadWALFile) Fd() uintptr                        { return vfs.InvalidFd }

// deadWALInfo describes a deadWALFile: empty.
type deadWALInfo struct{ name string }

func (i deadWALInfo) Name() string           { return i.name }
func (i deadWALInfo) Size() int64            { return 0 }
func (i deadWALInfo) Mode() os.FileMode      { return 0o644 }
func (i deadWALInfo) ModTime() time.Time     { return time.Time{} }
func (i deadWALInfo) IsDir() bool            { return false }
func (i deadWALInfo) Sys() any               { return nil }
func (i deadWALInfo) DeviceID() vfs.DeviceID { return vfs.DeviceID{} }

// sizingFile is a WAL file whose Preallocate extends its size (see
// walSizingFS).
type sizingFile struct {
	vfs.File
}

func (f sizingFile) Preallocate(offset, length int64) error {
	if fd := f.Fd(); fd != vfs.InvalidFd {
		if err := extend(fd, offset, length); err == nil {
			return nil
		}
	}
	return f.File.Preallocate(offset, length)
}
