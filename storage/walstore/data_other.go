//go:build !linux

package walstore

import "os"

// dataRanges calls fn once for [from, size): without Linux's SEEK_DATA the
// whole range is read.
func dataRanges(_ *os.File, from, size int64, fn func(lo, hi int64) error) error {
	if from >= size {
		return nil
	}
	return fn(from, size)
}
