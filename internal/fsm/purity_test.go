package fsm

import (
	"go/build"
	"go/parser"
	"go/token"
	"strconv"
	"testing"
)

// The state machine is a pure function of (state, index, command)
// (DESIGN.md invariant 11): no clock, no randomness, no process or
// shared state. The property tests catch an impurity that changes an
// outcome they try; this one catches the import that brings one in,
// whether or not a test's outcome shows it (a read of the clock that
// only decides on some machines, a random tie-break that happens to agree).
func TestNoImpureImports(t *testing.T) {
	forbidden := map[string]string{
		"time":            "a clock (time decisions are the leader's, and logged)",
		"math/rand":       "randomness",
		"math/rand/v2":    "randomness",
		"crypto/rand":     "randomness",
		"os":              "the process's environment and files",
		"net":             "the network",
		"sync":            "state shared with other goroutines",
		"sync/atomic":     "state shared with other goroutines",
		"runtime":         "the runtime's state",
		"unsafe":          "memory outside the type system",
		"hash/maphash":    "a per-process random seed",
		"go.uber.org/zap": "logging (no side effects in apply)",
	}
	// The files of the build under test (build tags honoured: the
	// fsmbug build, a deliberately broken machine for verify's self-test,
	// reads its switch from the environment).
	pkg, err := build.Default.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	fset := token.NewFileSet()
	for _, f := range pkg.GoFiles {
		ast, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range ast.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			if why, bad := forbidden[path]; bad {
				t.Errorf("%s imports %q: %s has no place in the state machine", f, path, why)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no source file checked")
	}
}
