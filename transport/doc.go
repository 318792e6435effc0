// Package transport carries raft messages between the replicas of one
// quorumlock cluster over gRPC.
//
// Every replica runs one Transport. It sends through one long-lived outbound
// stream per peer (the client side of the Peer.Stream RPC of
// internal/lockpb) and receives on the streams its peers open to it, served
// by the replica's shared grpc.Server (Register). Raft messages travel only
// in the outbound direction of a stream; the reply direction carries the
// handshake answer and nothing else.
//
// # Protocol
//
//  1. The sender opens Peer.Stream and sends a frame holding only
//     Hello{cluster_id, from: own ID, to: peer ID}.
//  2. The receiver checks the Hello: the cluster ID must be its own, to must
//     be its own ID, and from must be another member of the cluster. If not,
//     it ends the stream with codes.FailedPrecondition (wrong cluster or
//     wrong recipient), codes.PermissionDenied (unknown sender, or this
//     replica's own ID), codes.InvalidArgument (first frame without Hello) or
//     codes.DeadlineExceeded (no frame within 5 s), logs it and counts it in
//     Stats.InboundRejected. Messages on a stream whose handshake did not
//     succeed, including any sent along with the Hello, are never delivered.
//     The handshake identifies but does not authenticate: a process that
//     knows the cluster ID can claim a member's ID until TLS credentials
//     (Config.DialOptions and the server's options) are configured.
//  3. The receiver answers with its own Hello{cluster_id, from: own ID, to:
//     sender ID}. The sender checks that the answer comes from the cluster and
//     the member it meant to reach; a mismatch or a rejection counts in
//     Stats.OutboundRejected and the sender retries with backoff.
//  4. The sender then sends frames of marshaled raftpb.Messages, as many as
//     are queued, up to 4096 messages and 2 MiB per frame (a single larger
//     message goes alone in its frame). The receiver unmarshals them in
//     order and hands each to Config.Handler. A message that does not
//     unmarshal, or whose From or To do not match the handshake, ends the
//     stream with codes.InvalidArgument.
//  5. A newer handshake from the same peer supersedes an older stream: the
//     older one is closed, and delivery from the newer one starts only after
//     the older one delivered its last message, so the messages of one peer
//     reach Handler in the order they were sent.
//
// # Failures
//
// Send never blocks. A message is dropped, and the peer is reported through
// Config.Unreachable, when the peer's queue is full, when the stream to the
// peer fails, and while the sender waits to reconnect (50 ms doubling to 2 s,
// with jitter). Raft retransmits what it needs. A dropped or failed MsgSnap is
// also reported through Config.SnapshotStatus with raft.SnapshotFailure.
//
// # Goroutines
//
// New starts one sender goroutine per peer, which connects in the background,
// and one goroutine that makes the Unreachable and SnapshotStatus calls. Each
// inbound stream runs on the gRPC handler goroutine plus one reader
// goroutine. Close stops all of them and waits for them to return; no
// callback runs after Close returns.
//
// Snapshots currently travel as ordinary messages inside a frame, so a
// snapshot larger than the receiving server's maximum message size (gRPC's
// default is 4 MiB) cannot be delivered; chunked snapshot streaming replaces
// this path.
package transport
