package harness

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// tb is the testing.TB that internal/testcluster is given, so that a
// cluster can run outside a test (the verify command) and be stopped and
// restarted from any goroutine. Fatalf panics with a fatal value, which the
// harness recovers where it calls the cluster; Errorf is recorded. Other
// methods of testing.TB are not used by testcluster (calling one panics).
type tb struct {
	testing.TB

	dir string
	log func(string)

	mu       sync.Mutex
	cleanups []func()
	errs     []string
	n        int
}

// fatal is the panic value of tb.Fatalf.
type fatal struct{ msg string }

func (f fatal) Error() string { return f.msg }

func newTB(dir string, log func(string)) *tb { return &tb{dir: dir, log: log} }

func (t *tb) Helper()      {}
func (t *tb) Name() string { return "verify" }

func (t *tb) TempDir() string {
	t.mu.Lock()
	t.n++
	n := t.n
	t.mu.Unlock()
	d := fmt.Sprintf("%s/tmp%d", t.dir, n)
	if err := os.MkdirAll(d, 0o755); err != nil {
		panic(fatal{err.Error()})
	}
	return d
}

func (t *tb) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

func (t *tb) Fatalf(format string, args ...any) { panic(fatal{fmt.Sprintf(format, args...)}) }
func (t *tb) Fatal(args ...any)                 { panic(fatal{fmt.Sprint(args...)}) }

func (t *tb) Errorf(format string, args ...any) {
	t.mu.Lock()
	t.errs = append(t.errs, fmt.Sprintf(format, args...))
	t.mu.Unlock()
	t.Logf(format, args...)
}

func (t *tb) Logf(format string, args ...any) {
	if t.log != nil {
		t.log(fmt.Sprintf(format, args...))
	}
}

func (t *tb) Log(args ...any) { t.Logf("%s", fmt.Sprint(args...)) }

// Failed reports whether Errorf was called.
func (t *tb) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.errs) > 0
}

// runCleanups runs the registered cleanups, last first.
func (t *tb) runCleanups() {
	t.mu.Lock()
	cs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}

// errors returns what Errorf recorded.
func (t *tb) errors() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.errs...)
}

// guard runs f, turning a tb.Fatalf panic into an error.
func guard(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if fe, ok := r.(fatal); ok {
				err = fe
				return
			}
			panic(r)
		}
	}()
	f()
	return nil
}
