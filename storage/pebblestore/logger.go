package pebblestore

import (
	"fmt"

	"go.uber.org/zap"
)

// pebbleLogger adapts a zap logger to pebble.Logger.
//
// Pebble's default Fatalf exits the process. A replica must instead stop with
// an error, so Fatalf logs, records the failure through onFatal (which makes
// the store refuse every later write) and returns. Pebble calls Fatalf for a
// failed commit (then returns nil from Apply) and for failed MANIFEST writes;
// in both cases the store never writes again, and fenceFS keeps Pebble,
// which goes on after Fatalf returns, from changing the files any further.
type pebbleLogger struct {
	log     *zap.SugaredLogger
	onFatal func(error)
}

// Infof implements pebble.Logger.
func (l pebbleLogger) Infof(format string, args ...any) { l.log.Infof(format, args...) }

// Errorf implements pebble.Logger.
func (l pebbleLogger) Errorf(format string, args ...any) { l.log.Errorf(format, args...) }

// Fatalf implements pebble.Logger without exiting; see pebbleLogger.
func (l pebbleLogger) Fatalf(format string, args ...any) {
	err := &fatalError{msg: fmt.Sprintf(format, args...)}
	// Keep the cause reachable for errors.Is (for example a syscall or an
	// injected error passed as an argument).
	for _, a := range args {
		if cause, ok := a.(error); ok {
			err.cause = cause
			break
		}
	}
	l.log.Errorw("pebble fatal error; the store refuses further writes", "error", err.msg)
	l.onFatal(err)
}

// fatalError is a failure pebble reported through Logger.Fatalf.
type fatalError struct {
	msg   string
	cause error // first error argument of the Fatalf call, or nil
}

func (e *fatalError) Error() string { return "pebblestore: pebble fatal error: " + e.msg }

func (e *fatalError) Unwrap() error { return e.cause }
