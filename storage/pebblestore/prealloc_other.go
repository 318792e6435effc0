//go:build !linux

package pebblestore

import "errors"

// extend is available on Linux only; elsewhere the file system's own
// Preallocate is used.
func extend(fd uintptr, offset, length int64) error {
	return errors.ErrUnsupported
}
