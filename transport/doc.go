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
//     knows the cluster ID can claim a member's ID unless Config.Authorize
//     checks the stream's credentials (the replica requires, with mutual
//     TLS, a client certificate that verifies against the peer CA). A
//     stream Authorize refuses ends with codes.PermissionDenied.
//  3. The receiver answers with its own Hello{cluster_id, from: own ID, to:
//     sender ID}. The sender checks that the answer comes from the cluster and
//     the member it meant to reach; a mismatch or a rejection counts in
//     Stats.OutboundRejected and the sender retries with backoff.
//  4. The sender then sends frames of marshaled raftpb.Messages, as many as
//     are queued, up to 4096 messages and 2 MiB per frame (a single larger
//     message goes alone in its frame). The receiver unmarshals them in
//     order and hands each to Config.Handler. A message that does not
//     unmarshal, or whose From or To do not match the handshake, ends the
//     stream with codes.InvalidArgument, and so does a second Hello.
//  5. A newer handshake from the same peer supersedes an older stream: the
//     older one is closed (codes.Aborted), and delivery from the newer one starts only after
//     the older one delivered its last message, so the messages of one peer
//     reach Handler in the order they were sent.
//
// # Snapshots
//
// A MsgSnap does not go on the message stream: a snapshot can be far larger
// than a gRPC message may be. Each peer has a snapshot sender that transfers
// one snapshot at a time on a connection of its own, through the
// client-streaming Peer.Snapshot RPC:
//
//  1. The sender opens Peer.Snapshot and sends a first chunk holding Hello,
//     the MsgSnap marshaled with its snapshot data left out, total (the
//     length of the data in bytes) and crc32c (the CRC-32C of the data), and
//     no data.
//  2. The receiver checks the Hello by the rules of the message stream (step
//     2 above; a refusal counts in Stats.InboundRejected), then the header:
//     a MsgSnap from the sender to this replica without data
//     (codes.InvalidArgument otherwise), and total at most
//     Config.MaxSnapshotBytes (codes.ResourceExhausted otherwise). Only then
//     does it allocate a buffer of total bytes. A newer transfer from the
//     same member ends an older one (codes.Aborted), so one buffer per
//     member is the most it holds.
//  3. The sender sends the data in order in chunks of 1 MiB, each holding
//     offset and data only. A chunk's Send returns once gRPC has taken it,
//     which its flow control delays while the receiver is behind, so no
//     more than the stream's flow-control window (4 MiB on a quorumlock
//     Node's connections) and a chunk are in flight beyond what the
//     receiver has read. A chunk that does not continue where the previous
//     one ended, or runs past total, ends the transfer with
//     codes.InvalidArgument.
//  4. The sender closes its side. The receiver checks that total bytes
//     arrived (codes.InvalidArgument) and that their CRC-32C is the announced
//     one (codes.DataLoss), restores the data into the MsgSnap and hands it
//     to Handler; only then does it answer with SnapshotAck holding its own
//     Hello, which the sender checks as in step 3 above. Refusals after the
//     handshake count in Stats.SnapshotsRejected, and nothing of a refused
//     transfer reaches Handler.
//  5. The sender reports raft.SnapshotFinish through Config.SnapshotStatus
//     after a valid SnapshotAck, and raft.SnapshotFailure on any failure: a
//     refusal, a broken connection, or no progress (connecting, a chunk taken
//     by the stream, the acknowledgement) for Config.SnapshotStallTimeout.
//     The receiver likewise gives up on a transfer that sends no chunk for
//     SnapshotStallTimeout. It does not retry: raft sends a new MsgSnap when
//     it still needs one.
//
// Send hands a MsgSnap to the snapshot sender without blocking. While a
// transfer runs, at most one more MsgSnap waits; a newer one replaces it (it
// is counted in Stats.Dropped but not reported, as the newer one's status
// stands for it). A snapshot travels independently of the message stream,
// so it may reach Handler before or after messages its sender sent around
// it, which raft tolerates; Handler is still called one message at a time
// per peer.
//
// # Failures
//
// Send never blocks. A message is dropped, and the peer is reported through
// Config.Unreachable, when the peer's queue is full, when the stream to the
// peer fails, and while the sender waits to reconnect (50 ms doubling to
// Config.MaxReconnectWait, 2 s by default, with jitter). Raft retransmits what it needs. A snapshot whose transfer
// fails is reported through Config.SnapshotStatus with raft.SnapshotFailure
// (not through Unreachable).
//
// # Goroutines
//
// New starts two sender goroutines per peer, one for messages, which
// connects in the background (and, while its stream is up, runs one more
// that reads the stream's reply direction, to notice promptly when the peer
// ends it), and one for snapshots, and one goroutine that makes the
// Unreachable and SnapshotStatus calls. Each inbound stream and
// each inbound snapshot transfer runs on the gRPC handler goroutine plus one
// reader goroutine. Close stops all of them and waits for them to return; no
// callback runs after Close returns.
package transport
