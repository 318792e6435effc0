package walstore

import (
	"errors"
	"os"
	"syscall"
)

// lseek whence values for data and holes (Linux).
const (
	seekData = 3
	seekHole = 4
)

// dataRanges calls fn for each range [lo, hi) of f within [from, size) that
// may hold data, skipping holes: a WAL segment is preallocated, and the
// space never written reads as a hole on file systems that track it (ext4,
// xfs). Without that support the whole range is one range.
func dataRanges(f *os.File, from, size int64, fn func(lo, hi int64) error) error {
	for off := from; off < size; {
		lo, err := f.Seek(off, seekData)
		if errors.Is(err, syscall.ENXIO) {
			return nil
		}
		if err != nil {
			return fn(off, size)
		}
		hi, err := f.Seek(lo, seekHole)
		if err != nil {
			return fn(lo, size)
		}
		hi = min(hi, size)
		if lo >= hi {
			return nil
		}
		if err := fn(lo, hi); err != nil {
			return err
		}
		off = hi
	}
	return nil
}
