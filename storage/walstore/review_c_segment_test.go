package walstore

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/quorumlock/quorumlock/storage"
)

// TestReviewCEarlierSegmentCutShort cuts a segment before the last one
// short (by a tenth, by half, to nothing), or zeroes it from the middle
// on: a crash can only tear the last segment, so Open must refuse naming
// the segment (or its WAL directory), and never open with a shorter log.
func TestReviewCEarlierSegmentCutShort(t *testing.T) {
	setSegmentSize(t, 8<<10)
	for _, c := range []struct {
		name   string
		damage func(b []byte) []byte
	}{
		{"cut a tenth", func(b []byte) []byte { return b[:len(b)-len(b)/10] }},
		{"cut half", func(b []byte) []byte { return b[:len(b)/2] }},
		{"emptied", func(b []byte) []byte { return b[:0] }},
		{"zeroed from the middle", func(b []byte) []byte { clear(b[len(b)/2:]); return b }},
	} {
		for _, which := range []int{0, 1} {
			t.Run(fmt.Sprintf("%s/segment %d", c.name, which), func(t *testing.T) {
				dir := t.TempDir()
				segs := writeSegments(t, dir)
				modify(t, segs[which], c.damage)
				s, err := Open(dir, Options{})
				if err == nil {
					defer s.Close()
					last, _ := s.LastIndex()
					first, _ := s.FirstIndex()
					t.Fatalf("Open succeeded with log [%d, %d]", first, last)
				}
				if !errors.Is(err, storage.ErrCorrupt) {
					t.Fatalf("err = %v, want storage.ErrCorrupt", err)
				}
				if !contains(err, segs[which]) && !contains(err, walDir(t, dir)) {
					t.Fatalf("err = %v names neither %s nor its directory", err, segs[which])
				}
				if _, err := os.Stat(segs[which] + ".broken"); err == nil {
					t.Errorf("a refused Open repaired %s", segs[which])
				}
			})
		}
	}
}
