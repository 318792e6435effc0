package pebblestore

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/quorumlock/quorumlock/storage"
)

// manifestChunk is a valid full MANIFEST chunk (legacy header) carrying
// payload.
func manifestChunk(payload string) []byte {
	c := make([]byte, walLegacyHeaderSize+len(payload))
	binary.LittleEndian.PutUint16(c[4:6], uint16(len(payload)))
	c[6] = manifestFull
	copy(c[walLegacyHeaderSize:], payload)
	binary.LittleEndian.PutUint32(c[0:4], walChecksum(c[6:]))
	return c
}

// TestSyncedDamageAcrossZeroRuns: the scan for a valid record after a bad
// chunk skips runs of zeros (a preallocated WAL's tail) without stepping
// over a record that follows them, wherever it lies against the blocks
// the skip compares; a bad chunk followed by zeros only is a torn tail.
func TestSyncedDamageAcrossZeroRuns(t *testing.T) {
	const size = 3 * walBlockSize
	build := func(after int) []byte {
		data := make([]byte, size)
		n := copy(data, manifestChunk("first record"))
		bad := manifestChunk("damaged record")
		bad[walLegacyHeaderSize] ^= 0x01
		copy(data[n:], bad)
		if after >= 0 {
			copy(data[after:], manifestChunk("later record"))
		}
		return data
	}
	check := func(data []byte) error {
		fs := vfs.NewMem()
		f, err := fs.Create("MANIFEST-000001", vfs.WriteCategoryUnspecified)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		return syncedDamage(fs, "MANIFEST-000001", "MANIFEST", manifestChunkAt, walLegacyHeaderSize)
	}
	if err := check(build(-1)); err != nil {
		t.Fatalf("a bad chunk followed by zeros only: %v, want nil (a torn tail)", err)
	}
	for _, at := range []int{
		100,                 // right after the bad chunk
		4096 - 6,            // type byte first of a compared block
		4096 - 7,            // type byte last of the block before
		2*4096 + 1000,       // inside a block
		walBlockSize,        // first of a 32 KiB block
		size - 40,           // near the end of the file
		2*walBlockSize - 30, // last chunk of a 32 KiB block
	} {
		err := check(build(at))
		if !errors.Is(err, storage.ErrCorrupt) {
			t.Errorf("later record at %d: err = %v, want storage.ErrCorrupt", at, err)
		}
	}
}

func TestNextNonZero(t *testing.T) {
	b := make([]byte, 3*4096+10)
	if got := nextNonZero(b, 0); got != -1 {
		t.Fatalf("all zeros: %d, want -1", got)
	}
	for _, at := range []int{0, 1, 4095, 4096, 4097, 8191, 3*4096 + 9} {
		clear(b)
		b[at] = 7
		for _, from := range []int{0, at / 2, at} {
			if got := nextNonZero(b, from); got != at {
				t.Errorf("nonzero at %d, from %d: %d", at, from, got)
			}
		}
		if got := nextNonZero(b, at+1); got != -1 {
			t.Errorf("nonzero at %d, from %d: %d, want -1", at, at+1, got)
		}
	}
}
