// Package quorumlock is an embeddable distributed lock service. An
// application links it into its own 3 or 5 replicas; the replicas agree on
// every change through a Raft log (go.etcd.io/raft) and hand out fencing
// tokens, so a lock survives the loss of a minority of replicas and a
// protected resource can reject a holder whose grant was superseded.
//
// A replica is started with Start. Clients open a Session (a lease kept alive
// by heartbeats), take named locks with Acquire or TryAcquire, and pass each
// Lock's Token to the resource they protect, which checks it with a Fence.
//
//	node, err := quorumlock.Start(ctx, quorumlock.Config{ID: 1, Peers: peers, DataDir: dir})
//	s, err := node.NewSession(ctx)
//	l, err := s.Acquire(ctx, "orders/42")
//	err = resource.Write(data, l.Token()) // the resource calls fence.Admit("orders/42", token)
//	err = l.Release(ctx)
//
// Every call that takes a ctx treats a nil ctx as context.Background().
// The nil *Lock, *Session or *Leadership a failed call returns, and their
// zero values, answer every method without panicking: Release, Resign and
// Proclaim return ErrNotHeld, a Session's calls ErrSessionExpired, and
// Done and Lost are closed (nothing is held through them).
//
// The README lists the guarantees for users; docs/architecture.md maps each
// to its tests and lists where the code departs from the design (DESIGN.md,
// kept outside this repository, whose invariants the docstrings cite by
// number).
package quorumlock
