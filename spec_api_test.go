package quorumlock_test

import (
	"context"
	"net"
	"time"

	"go.uber.org/zap"

	"github.com/quorumlock/quorumlock"
)

// The public API named by the issues, checked at compile time: a change of
// name or signature breaks this file.
var (
	_ func(context.Context, quorumlock.Config) (*quorumlock.Node, error)              = quorumlock.Start
	_ func() error                                                                    = (*quorumlock.Node)(nil).Close
	_ func() quorumlock.Status                                                        = (*quorumlock.Node)(nil).Status
	_ func(context.Context, ...quorumlock.SessionOption) (*quorumlock.Session, error) = (*quorumlock.Node)(nil).NewSession
	_ func(time.Duration) quorumlock.SessionOption                                    = quorumlock.WithTTL
	_ func() uint64                                                                   = (*quorumlock.Session)(nil).ID
	_ func(context.Context, string) (*quorumlock.Lock, error)                         = (*quorumlock.Session)(nil).Acquire
	_ func(context.Context, string) (*quorumlock.Lock, error)                         = (*quorumlock.Session)(nil).TryAcquire
	_ func(context.Context) error                                                     = (*quorumlock.Session)(nil).Close
	_ func() <-chan struct{}                                                          = (*quorumlock.Session)(nil).Done
	_ func() string                                                                   = (*quorumlock.Lock)(nil).Name
	_ func() quorumlock.Token                                                         = (*quorumlock.Lock)(nil).Token
	_ func() <-chan struct{}                                                          = (*quorumlock.Lock)(nil).Lost
	_ func(context.Context) error                                                     = (*quorumlock.Lock)(nil).Release
	_ func(context.Context, string) (quorumlock.LockInfo, error)                      = (*quorumlock.Node)(nil).Holder
	_ func() *quorumlock.Fence                                                        = quorumlock.NewFence
	_ func(string, quorumlock.Token) error                                            = (*quorumlock.Fence)(nil).Admit

	// Issue 4.
	_ func(context.Context, string, []byte) (*quorumlock.Leadership, error) = (*quorumlock.Session)(nil).Elect
	_ func(context.Context, string, []byte) (*quorumlock.Leadership, error) = (*quorumlock.Node)(nil).Elect
	_ func() quorumlock.Token                                               = (*quorumlock.Leadership)(nil).Epoch
	_ func() <-chan struct{}                                                = (*quorumlock.Leadership)(nil).Done
	_ func() context.Context                                                = (*quorumlock.Leadership)(nil).Context
	_ func(context.Context) error                                           = (*quorumlock.Leadership)(nil).Resign
	_ func(context.Context, []byte) error                                   = (*quorumlock.Leadership)(nil).Proclaim
	_ func(context.Context, string) (quorumlock.LeaderInfo, error)          = (*quorumlock.Node)(nil).Leader
	_ func(context.Context, string) <-chan quorumlock.LeaderInfo            = (*quorumlock.Node)(nil).Observe

	// Issue 5: the same API through a remote client.
	_ func(context.Context, []string, ...quorumlock.ClientOption) (*quorumlock.Client, error) = quorumlock.Dial
	_ func(context.Context, ...quorumlock.SessionOption) (*quorumlock.Session, error)         = (*quorumlock.Client)(nil).NewSession
	_ func(context.Context, string) (quorumlock.LockInfo, error)                              = (*quorumlock.Client)(nil).Holder
	_ func(context.Context, string) (quorumlock.LeaderInfo, error)                            = (*quorumlock.Client)(nil).Leader
	_ func(context.Context, string) <-chan quorumlock.LeaderInfo                              = (*quorumlock.Client)(nil).Observe
	_ func() error                                                                            = (*quorumlock.Client)(nil).Close
	_ func(context.Context, string, []byte) (*quorumlock.Leadership, error)                   = (*quorumlock.Client)(nil).Elect

	// Sentinels.
	_ = []error{
		quorumlock.ErrLocked, quorumlock.ErrSessionExpired, quorumlock.ErrStaleToken,
		quorumlock.ErrInvalidName, quorumlock.ErrNotHeld, quorumlock.ErrLimit,
		quorumlock.ErrClosed, quorumlock.ErrUnknownOutcome, quorumlock.ErrNoLeader,
	}

	// Config fields named by issue 2.
	_ = quorumlock.Config{
		ID:            1,
		Peers:         map[uint64]string{1: "127.0.0.1:1"},
		DataDir:       "",
		Listener:      net.Listener(nil),
		SessionTTL:    10 * time.Second,
		TickInterval:  100 * time.Millisecond,
		ElectionTicks: 10,
		Logger:        (*zap.Logger)(nil),
	}
	// Status fields, LockInfo and LeaderInfo fields.
	_        = quorumlock.Status{ID: 1, Leader: 0, Term: 0, Commit: 0, Applied: 0}
	_        = quorumlock.LockInfo{Name: "", Holder: 0, Token: quorumlock.Token(0), Waiters: []uint64(nil)}
	_        = quorumlock.LeaderInfo{Role: "", Session: 0, Epoch: quorumlock.Token(0), Value: []byte(nil)}
	_ uint64 = uint64(quorumlock.Token(0))
)
