package pebblestore

import (
	"fmt"
	"os"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// fenceFS stops Pebble from changing the store's files once Pebble's own
// state can no longer be trusted: after a Logger.Fatalf or a failed
// directory sync (Store.setFenced), every create, write, sync, rename, link
// and removal of a file other than a WAL returns that error.
//
// Pebble's Logger.Fatalf is meant to end the process; the store's logger
// returns instead (see pebbleLogger), and Pebble then goes on from a state
// it does not expect. After a MANIFEST sync failed, it retried the flush and
// recorded the same keys in a second table, and every later Open panicked in
// a compaction ("invariant violation: ... out of order"), killing the
// process. Behind the fence, the files stay as they were when the store
// failed, which is what a crash at that moment leaves and what Pebble's
// recovery is built for. The store never writes again after a failure, so
// the fence costs it nothing; reads go on.
//
// Other failures (a failed flush or compaction, a WAL that failed) leave
// Pebble consistent and do not raise the fence: Pebble may go on retrying a
// flush, which matters to a commit that Pebble stalls until a flush
// succeeds (a Save that entered such a stall before the failure was seen
// completes, and fails, once the disk has space again). Each table Pebble
// creates after any failure waits retryPause first, so that the retries do
// not spin.
//
// WAL files are left out: Pebble panics (DB.rotateWAL) when it cannot close
// the previous WAL or open the next one while it switches memtables, which
// a commit that passed the store's check just before a background failure
// may still do; walFile and walSizingFS handle WALs. Directory syncs never
// fail either: one fails inside that switch and Pebble panics, so a failed
// directory sync is recorded (onSyncErr), which raises the fence before
// Pebble can act on the directory's state, and reported to Pebble as done;
// once the fence is up they are skipped.
//
// park runs first in every operation that changes a file, WALs included: it
// blocks for good once Open has given up on Pebble (Store.openPebble).
type fenceFS struct {
	vfs.FS
	fenced    func() error // the failure that raised the fence, or nil
	broken    func() error // the store's first failure of any kind, or nil
	onSyncErr func(error)  // records a failed directory sync, raising the fence
	park      func()
	pause     func() // nil: sleep retryPause (tests count the pauses)
}

// retryPause slows down table creation after a failure: Pebble retries a
// failed flush or compaction at once and forever, and each attempt starts
// by creating a table. Without the pause a failed store spins a processor
// until it is closed (a follower that receives nothing new may not write,
// and so not stop, for a while).
const retryPause = 100 * time.Millisecond

func (fs fenceFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	fs.park()
	if isWAL(name) {
		return fs.FS.Create(name, category)
	}
	if fs.broken() != nil {
		if fs.pause != nil {
			fs.pause()
		} else {
			time.Sleep(retryPause)
		}
	}
	if err := fs.fenced(); err != nil {
		return nil, err
	}
	f, err := fs.FS.Create(name, category)
	return fs.wrap(f, err)
}

func (fs fenceFS) OpenReadWrite(name string, category vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	fs.park()
	if isWAL(name) {
		return fs.FS.OpenReadWrite(name, category, opts...)
	}
	if err := fs.fenced(); err != nil {
		return nil, err
	}
	f, err := fs.FS.OpenReadWrite(name, category, opts...)
	return fs.wrap(f, err)
}

func (fs fenceFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	fs.park()
	if isWAL(newname) {
		return fs.FS.ReuseForWrite(oldname, newname, category)
	}
	if err := fs.fenced(); err != nil {
		return nil, err
	}
	f, err := fs.FS.ReuseForWrite(oldname, newname, category)
	return fs.wrap(f, err)
}

func (fs fenceFS) OpenDir(name string) (vfs.File, error) {
	f, err := fs.FS.OpenDir(name)
	if err != nil {
		return nil, err
	}
	return fencedDir{File: f, name: name, fs: fs}, nil
}

func (fs fenceFS) Link(oldname, newname string) error {
	fs.park()
	if err := fs.fenced(); err != nil {
		return err
	}
	return fs.FS.Link(oldname, newname)
}

func (fs fenceFS) Remove(name string) error {
	fs.park()
	if err := fs.fenced(); err != nil {
		return err
	}
	return fs.FS.Remove(name)
}

func (fs fenceFS) RemoveAll(name string) error {
	fs.park()
	if err := fs.fenced(); err != nil {
		return err
	}
	return fs.FS.RemoveAll(name)
}

func (fs fenceFS) Rename(oldname, newname string) error {
	fs.park()
	if err := fs.fenced(); err != nil {
		return err
	}
	return fs.FS.Rename(oldname, newname)
}

func (fs fenceFS) MkdirAll(dir string, perm os.FileMode) error {
	fs.park()
	if err := fs.fenced(); err != nil {
		return err
	}
	return fs.FS.MkdirAll(dir, perm)
}

func (fs fenceFS) wrap(f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return fencedFile{File: f, fs: fs}, nil
}

// fencedFile is a writable file of a fenceFS. Its descriptor (Fd) is the
// wrapped file's: a WAL sync that waits off the processor (syncwait.go) goes
// to it directly, which is harmless: a sync changes no content.
type fencedFile struct {
	vfs.File
	fs fenceFS
}

func (f fencedFile) failed() error {
	f.fs.park()
	return f.fs.fenced()
}

func (f fencedFile) Write(p []byte) (int, error) {
	if err := f.failed(); err != nil {
		return 0, err
	}
	return f.File.Write(p)
}

func (f fencedFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.failed(); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f fencedFile) Preallocate(off, n int64) error {
	if err := f.failed(); err != nil {
		return err
	}
	return f.File.Preallocate(off, n)
}

func (f fencedFile) Sync() error {
	if err := f.failed(); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f fencedFile) SyncData() error {
	if err := f.failed(); err != nil {
		return err
	}
	return f.File.SyncData()
}

func (f fencedFile) SyncTo(length int64) (bool, error) {
	if err := f.failed(); err != nil {
		return false, err
	}
	return f.File.SyncTo(length)
}

// fencedDir is a directory opened by a fenceFS (Pebble opens directories
// only to sync them). See fenceFS for why its Sync never fails.
type fencedDir struct {
	vfs.File
	name string
	fs   fenceFS
}

func (d fencedDir) Sync() error {
	d.fs.park()
	if d.fs.fenced() != nil {
		return nil
	}
	if err := d.File.Sync(); err != nil {
		d.fs.onSyncErr(fmt.Errorf("sync directory %s: %w", d.name, err))
	}
	return nil
}
