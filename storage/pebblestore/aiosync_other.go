//go:build !(linux && (amd64 || arm64))

package pebblestore

import "errors"

// newOffCPUSyncer: Linux AIO is not available here, and WAL syncs block in
// the file's own SyncData.
func newOffCPUSyncer() (offCPUSyncer, error) {
	return nil, errors.New("pebblestore: off-processor fsync needs Linux AIO on amd64 or arm64")
}
