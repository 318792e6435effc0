package pebblestore

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// TestReviewCOlderWALDamaged keeps several Pebble WALs unflushed (every
// flush is held back until the crash image is taken), then damages a WAL
// that is not the newest: cut short, emptied, or zeroed from its middle
// on. Only the newest WAL may end in a torn write, so Open must refuse
// each of these, or open with every acknowledged entry; it must never
// open with fewer.
func TestReviewCOlderWALDamaged(t *testing.T) {
	mem := vfs.NewCrashableMem()
	release := make(chan struct{})
	fs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpCreate && strings.HasSuffix(op.Path, ".sst") {
			<-release
		}
		return nil
	}))
	s := openT(t, "db", Options{FS: fs}, defaultCacheLimits)
	acked, err := saveUntilError(s, 1, 400)
	if err != nil {
		t.Fatal(err)
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	close(release)
	_ = s.Close()
	names, err := crashed.List("db")
	if err != nil {
		t.Fatal(err)
	}
	var wals []string
	for _, n := range names {
		if strings.HasSuffix(n, ".log") {
			wals = append(wals, n)
		}
	}
	slices.Sort(wals)
	if len(wals) < 3 {
		t.Fatalf("want several unflushed WALs, have %v", wals)
	}
	damage := map[string]func(img *vfs.MemFS, path string){
		"cut-half":  func(img *vfs.MemFS, p string) { truncateFile(t, img, p, len(fileData(t, img, p))/2) },
		"cut-tenth": func(img *vfs.MemFS, p string) { truncateFile(t, img, p, len(fileData(t, img, p))/10) },
		"empty":     func(img *vfs.MemFS, p string) { truncateFile(t, img, p, len(fileData(t, img, p))) },
		"zero-second-half": func(img *vfs.MemFS, p string) {
			b := fileData(t, img, p)
			clear(b[len(b)/2:])
		},
	}
	for _, w := range wals[:len(wals)-1] {
		for what, f := range damage {
			img := crashed.CrashClone(vfs.CrashCloneCfg{})
			f(img, "db/"+w)
			s, err := Open("db", Options{FS: img})
			if err != nil {
				continue // refused
			}
			last, lerr := s.LastIndex()
			ents, eerr := s.Entries(1, acked+1, noLimitSize)
			_ = s.Close()
			if lerr != nil || eerr != nil || last != acked || uint64(len(ents)) != acked {
				t.Errorf("older WAL %s %s: opened with last index %d (%v) and %d entries (%v); %s entries acknowledged",
					w, what, last, lerr, len(ents), eerr, strconv.FormatUint(acked, 10))
			}
		}
	}
}
