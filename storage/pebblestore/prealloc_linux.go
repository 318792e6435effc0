package pebblestore

import "syscall"

// extend allocates [offset, offset+length) of the file and raises its size
// to cover it (fallocate mode 0); the new range reads as zeros.
func extend(fd uintptr, offset, length int64) error {
	return syscall.Fallocate(int(fd), 0, offset, length)
}
