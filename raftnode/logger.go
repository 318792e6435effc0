package raftnode

import (
	"fmt"

	"go.uber.org/zap"
)

// zapRaftLogger adapts zap to raft.Logger. raft calls Panic only on broken
// internal invariants (for example a corrupted log); it requires that the
// call does not return, so Panic and Fatal panic after logging.
type zapRaftLogger struct{ s *zap.SugaredLogger }

func (l *zapRaftLogger) Debug(v ...any)                   { l.s.Debug(v...) }
func (l *zapRaftLogger) Debugf(format string, v ...any)   { l.s.Debugf(format, v...) }
func (l *zapRaftLogger) Error(v ...any)                   { l.s.Error(v...) }
func (l *zapRaftLogger) Errorf(format string, v ...any)   { l.s.Errorf(format, v...) }
func (l *zapRaftLogger) Info(v ...any)                    { l.s.Info(v...) }
func (l *zapRaftLogger) Infof(format string, v ...any)    { l.s.Infof(format, v...) }
func (l *zapRaftLogger) Warning(v ...any)                 { l.s.Warn(v...) }
func (l *zapRaftLogger) Warningf(format string, v ...any) { l.s.Warnf(format, v...) }
func (l *zapRaftLogger) Fatal(v ...any)                   { l.Panic(v...) }
func (l *zapRaftLogger) Fatalf(format string, v ...any)   { l.Panicf(format, v...) }

func (l *zapRaftLogger) Panic(v ...any) {
	msg := fmt.Sprint(v...)
	l.s.Error(msg)
	panic(msg)
}

func (l *zapRaftLogger) Panicf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.s.Error(msg)
	panic(msg)
}
