// Package raftnode drives go.etcd.io/raft's RawNode for one replica: it owns
// the goroutine that ticks raft, steps incoming messages, batches proposals,
// runs the Ready loop against durable storage and the transport, applies
// committed entries to the state machine, and serves ReadIndex requests.
//
// The Ready loop follows the contract of go.etcd.io/raft (doc.go). Each
// loop turn first takes everything queued (proposals, messages, reads), so
// one Ready carries it all. On a follower (or candidate):
//
//  1. Save the HardState and Entries of the Ready in one synced write
//     (one fsync per Ready, however many proposals it carries).
//  2. Send the Ready's messages; none leaves before step 1 is durable, so a
//     vote or an append acknowledgement is never lost (invariant 10).
//  3. Apply the committed entries, in order, to the state machine, and
//     resolve ReadIndex requests whose read state arrived.
//  4. Advance.
//
// A leader sends its messages first (all but append and vote responses,
// which wait for the save) and applies before it saves, so that the
// followers write new entries while it writes its own (raft thesis
// §10.2.1). That is safe because raft counts the leader's own copy towards
// a commit only once Advance reports it saved, and the entries a leader
// sees committed are already in its durable log.
//
// A failure to save stops the node for good: the error is reported through
// Config.OnFatal and every later call returns ErrStopped. An fsync that
// failed is never retried (the kernel may have dropped the dirty pages). A
// log read that fails while the node runs stops it the same way (raft would
// panic on it; see readGuard), and so does a peer's message that makes raft
// panic (a forged or broken peer: see step): the replica stops, the process
// that embeds it goes on.
package raftnode

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/quorumlock/quorumlock/clock"
)

// LogStore is the durable log the node runs on (storage.LogStore satisfies
// it).
type LogStore interface {
	raft.Storage
	Save(st *raftpb.HardState, ents []*raftpb.Entry) error
	SaveSnapshot(snap *raftpb.Snapshot) error
	Compact(index uint64) error
}

// Transport sends raft messages to peers. Send must not block.
type Transport interface {
	Send(msgs []*raftpb.Message)
}

// StateMachine receives committed entries. Every method is called on the
// node's goroutine and must not block on the node (no Propose, ReadIndex or
// WaitApplied from inside a callback: that would deadlock).
type StateMachine interface {
	// Apply applies committed entries in log order. It sees every entry,
	// including raft's empty no-op entries and conf changes (which the node
	// has already applied to raft's configuration).
	Apply(ents []*raftpb.Entry)
	// LeaderReady is called once this node is leader of term and has applied
	// every entry of earlier terms (it has just applied the first entry of
	// its own term).
	LeaderReady(term uint64)
	// LeaderLost is called when this node stops being leader (or stops).
	LeaderLost()
	// Snapshot captures the state as of the last applied entry, quickly:
	// it returns that index and a function that writes the image, which
	// the node runs on another goroutine while apply goes on.
	Snapshot() (index uint64, write func(io.Writer) error)
	// Restore replaces the state with a snapshot image taken at index (at
	// start, and when the leader sends one).
	Restore(index uint64, data []byte) error
}

// SnapshotVerifier may be implemented by a StateMachine: VerifySnapshot
// checks an image received from the leader before the node makes it
// durable. A snapshot from the leader replaces the follower's log when it is
// saved, so an image that Restore would refuse (corrupt, or of a format this
// binary does not read) must be refused before that: the node stops with
// the error and its storage stays as it was, instead of holding a snapshot
// it can never restore (it could not start again) in place of its log.
type SnapshotVerifier interface {
	VerifySnapshot(index uint64, data []byte) error
}

// Config configures a Node.
type Config struct {
	// ID is this node's raft member ID: non-zero, and one of Peers.
	// Required.
	ID uint64
	// Peers are the IDs of every voter, this node's included: non-zero and
	// distinct. They bootstrap a fresh log (New checks them then); a log
	// that has entries keeps its own configuration and Peers is ignored.
	Peers []uint64
	// Storage is the durable log.
	Storage LogStore
	// Transport carries messages to peers.
	Transport Transport
	// StateMachine receives committed entries.
	StateMachine StateMachine
	// Applied is the index the state machine has already applied (0 for an
	// empty state machine).
	Applied uint64
	// Clock drives raft's ticks. The default is clock.Real().
	Clock clock.Clock
	// TickInterval is the duration of one raft tick. The default (for 0 or
	// less) is 100 ms.
	TickInterval time.Duration
	// ElectionTicks is raft's election timeout in ticks; HeartbeatTicks is
	// its heartbeat interval. Defaults (for 0 or less): 10 and 1.
	ElectionTicks, HeartbeatTicks int
	// MaxSizePerMsg bounds the bytes of entries in one append message. The
	// default is 1 MiB.
	MaxSizePerMsg uint64
	// MaxInflightMsgs bounds unacknowledged append messages per follower.
	// The default (for 0 or less) is 256.
	MaxInflightMsgs int
	// CommitNoticeHold is how long a leader holds a commit notice before
	// sending it. After every commit, raft's leader sends each follower an
	// append without entries that carries the new commit index (raft.go's
	// bcastAppend after maybeCommit), and the follower answers it: in a
	// lock hand-off, a chain of commits one after the other, that is two
	// of every five messages. A held notice is dropped when an append
	// with entries goes out to the same follower meanwhile (it carries
	// the commit index too, as does every heartbeat), and sent when the
	// hold runs out otherwise; held notices are dropped when the node
	// stops leading. Raft is safe with messages delayed or lost; this
	// only delays when a follower applies a commit that no append or
	// heartbeat told it of sooner: by at most the hold while the leader
	// leads (a notice dropped on step-down leaves the commit to the next
	// leader's first one). Requests are answered from the leader's apply,
	// and a follower's ReadIndex read is mostly not delayed: the leader
	// answers it after a heartbeat round, and heartbeats carry the commit
	// index (as far as the follower has acknowledged entries). The
	// default (0) sends notices at once, as raft does.
	CommitNoticeHold time.Duration
	// Logger receives raft's and the node's logs. nil: no-op.
	Logger *zap.Logger
	// OnFatal is called once, from the node's goroutine, when a failure
	// stops the node: a failed write or log read of the storage, or a
	// peer's message raft panics on (ErrBadMessage). Its argument is what
	// Err then returns.
	OnFatal func(error)
	// SnapshotEntries is how many entries are applied between snapshots, at
	// least: a snapshot is also not taken before the payload applied since
	// the last one adds up to a quarter of that snapshot's size, so a large
	// table is not rewritten for a few entries, and the log a restart
	// replays stays proportional to the table (CockroachDB truncates a
	// range's log on a similar size ratio). The default is 10,000.
	SnapshotEntries uint64
	// CatchUpEntries is how many entries the log keeps behind a snapshot,
	// so a follower that is a little behind catches up from the log
	// instead of a snapshot (etcd keeps 5,000). The default is half of
	// SnapshotEntries, at most 5,000.
	CatchUpEntries uint64
	// OnSave, when set, is called on the node's goroutine after every Save
	// that writes (raft's Ready.MustSync: new entries, term or vote; each
	// is one synced write), with how long it took and how many entries it
	// wrote (metrics). A hard state that only moves the commit index is
	// not written (see storage.LogStore) and not reported. It must not
	// block or call into the node.
	OnSave func(d time.Duration, entries int)
	// OnSnapshot, when set, is called on the node's goroutine after a
	// snapshot this node took is durable, with its image size in bytes.
	OnSnapshot func(bytes int)
	// Failpoint, when set, is called on the node's goroutine with the name
	// of each Failpoint* point the Ready loop and a snapshot save pass. It
	// exists for crash tests, like etcd's gofail points: the test copies
	// what the replica has synced at that instant and stops it there. It
	// must not call into the node. The default (nil) calls nothing;
	// production code leaves it nil.
	Failpoint func(point string)
}

// The points at which Config.Failpoint is called. A follower's Ready passes
// them in the order before-save, after-save, after-send, after-apply; a
// leader's (which sends and applies before it saves, see handleReady) in the
// order before-save, after-send, after-apply, after-save.
const (
	// FailpointBeforeSave: a Ready was taken; nothing of it is saved, sent
	// or applied.
	FailpointBeforeSave = "before-save"
	// FailpointAfterSave: the Ready's snapshot, hard state and entries are
	// durable. On a follower none of its messages is sent yet.
	FailpointAfterSave = "after-save"
	// FailpointAfterSend: the Ready's messages are handed to the transport
	// (on a leader, all but the responses, which wait for the save); its
	// committed entries are not applied.
	FailpointAfterSend = "after-send"
	// FailpointAfterApply: the committed entries are applied (the state
	// machine has answered its waiters); read states are not resolved and
	// raft is not advanced (on a leader, the Ready is not saved either).
	FailpointAfterApply = "after-apply"
	// FailpointBeforeSnapshotSave: a snapshot, taken by this node or
	// received from the leader, is about to be saved.
	FailpointBeforeSnapshotSave = "before-snapshot-save"
	// FailpointAfterSnapshotSave: that snapshot is durable; the log behind
	// a snapshot this node took is not compacted yet, and one received is
	// neither restored into the state machine nor followed by the Ready's
	// hard state and entries yet.
	FailpointAfterSnapshotSave = "after-snapshot-save"
)

// Errors returned by Node methods.
var (
	// ErrStopped: the node has stopped: Stop was called, or a failure
	// stopped it (a failed write or log read, or ErrBadMessage; Err says
	// which).
	ErrStopped = errors.New("raftnode: stopped")
	// ErrBadMessage: the node stopped because raft panicked while
	// stepping a peer's message (Err wraps it, naming the message and the
	// panic; the stack is logged). No correct peer sends a message raft
	// panics on, such as a commit index past this replica's log; a bug
	// reached while stepping would be reported the same way. The
	// replica's saved state is untouched.
	ErrBadMessage = errors.New("raftnode: raft panicked on a peer's message")
	// ErrNotLeader: Propose was called on a node that is not the leader.
	ErrNotLeader = errors.New("raftnode: not the leader")
	// ErrNoTransferee: Resign found no other voter it heard from recently
	// over a working connection.
	ErrNoTransferee = errors.New("raftnode: no voter to transfer leadership to")
	// ErrCorruptState: New found a log and hard state that raft cannot
	// start from (for example a commit index past the last entry), or a
	// stored snapshot the state machine cannot restore.
	ErrCorruptState = errors.New("raftnode: corrupt state")
)

// Status is a snapshot of the node's raft state.
type Status struct {
	ID      uint64
	Leader  uint64 // 0 when unknown
	Term    uint64
	Commit  uint64
	Applied uint64
	State   raft.StateType
	// LeadTransferee is the voter a leadership transfer under way on this
	// leader goes to (Resign, TransferLeadership); 0 when none.
	LeadTransferee uint64
}

// Node runs one raft replica. Its exported methods are safe for concurrent
// use.
type Node struct {
	cfg     Config
	rn      *raft.RawNode
	reads   *readGuard // the storage raft reads through
	log     *zap.Logger
	clk     clock.Clock
	propc   chan proposal
	recvc   chan *raftpb.Message
	readc   chan *readRequest
	reportc chan report
	stopc   chan struct{}
	donec   chan struct{}
	stop    sync.Once
	started atomic.Bool // Start ran the loop, or Stop came first and closed donec

	status  atomic.Pointer[Status]
	errMu   sync.Mutex
	err     error
	leaderC atomic.Pointer[chan struct{}] // closed and replaced on every leader change

	// stepping is the peer message raft is stepping now (nil otherwise),
	// so that run can tell a panic on it from a bug.
	stepping *raftpb.Message

	releaseEpoch atomic.Uint64 // ReleaseDeferred calls so far (DeferEpoch)
	wakec        chan struct{} // buffer 1: wakes the loop after ReleaseDeferred

	appliedMu sync.Mutex
	applied   uint64
	appliedW  []appliedWaiter

	// Owned by the run goroutine.
	state      raft.StateType    // as of the latest Ready
	suspect    uint64            // the leader whose connection broke (0: none), see campaignIfSuspect
	suspectAt  uint64            // the term it led in
	silent     int               // ticks since the last message from the leader
	lostTerm   uint64            // term of a campaign after the leader's connection broke (0: none), see campaignIfSuspect
	recampaign bool              // as that pre-candidate it refused a pre-vote: campaign again at the next tick
	ticks      uint64            // ticks since start
	heard      map[uint64]uint64 // peer -> n.ticks at its latest message; dropped when reported unreachable
	isLeader   bool
	leaderTerm uint64
	readyTerm  uint64
	readSeq    uint64
	pending    []*readRequest // arrived, not yet covered by an issued round
	props      []proposal     // data proposals taken this turn, see flushProposals
	held       []proposal     // deferred proposals not yet taken, in arrival order (ProposeDeferred)
	releasedAt uint64         // releaseEpoch when the loop last released the held proposals for it
	inflight   map[uint64]*readRound
	confState  *raftpb.ConfState // as of the last applied conf change
	snapIndex  uint64            // index of the latest snapshot (taken or received)
	snapBytes  int               // size of the latest snapshot's image
	sinceSnap  int               // payload bytes applied since the latest snapshot was captured
	snapping   bool              // a snapshot is being written
	snapc      chan snapResult
	notices    map[uint64]*raftpb.Message // follower -> its held commit notice (CommitNoticeHold)
	noticeT    clock.Timer                // sends the held notices when the hold runs out (nil: none armed)
	noticec    chan struct{}              // buffer 1: noticeT fired
}

// snapResult is a snapshot image written off the node's goroutine.
type snapResult struct {
	index, term uint64
	conf        *raftpb.ConfState
	data        []byte
	err         error
}

type proposal struct {
	data     []byte
	errc     chan error  // the answer (ProposeAsync: nil)
	refused  func(error) // ProposeAsync: called if raft refuses the entry
	transfer uint64      // non-zero: a leadership transfer request, not a proposal
	resign   bool        // Resign: transfer to the best voter, answer on errc
	deferred bool        // ProposeDeferred: may be held, see releaseHeld
	epoch    uint64      // ProposeDeferred: DeferEpoch when the caller decided to defer
}

type readRequest struct {
	done  chan struct{}
	index uint64
	err   error
	// abandoned: the caller stopped waiting (its ctx ended). The loop
	// drops such a request instead of carrying it into another round
	// (see keepReads), closing done.
	abandoned atomic.Bool
	// finished: done is closed (the run goroutine's alone). A request
	// can be in two rounds at once: a retired one and its successor.
	finished bool
}

// finish answers q once; later calls do nothing.
func (q *readRequest) finish(index uint64, err error) {
	if q.finished {
		return
	}
	q.finished = true
	q.index, q.err = index, err
	close(q.done)
}

type readRound struct {
	reqs   []*readRequest
	issued int // ticks since issue
	// retired: unanswered for an election timeout, its requests went on to
	// a new round; it stays answerable until retiredReadTimeouts election
	// timeouts after it was issued (see tickReads).
	retired bool
}

// retiredReadTimeouts is how many election timeouts a retired read round
// waits for a late answer.
const retiredReadTimeouts = 8

type appliedWaiter struct {
	index uint64
	c     chan struct{}
}

type report struct {
	unreachable uint64
	snapshot    uint64 // non-zero: the peer a snapshot was sent to
	status      raft.SnapshotStatus
}

func (c *Config) withDefaults() Config {
	out := *c
	if out.Clock == nil {
		out.Clock = clock.Real()
	}
	if out.TickInterval <= 0 {
		out.TickInterval = 100 * time.Millisecond
	}
	if out.ElectionTicks <= 0 {
		out.ElectionTicks = 10
	}
	if out.HeartbeatTicks <= 0 {
		out.HeartbeatTicks = 1
	}
	if out.MaxSizePerMsg == 0 {
		out.MaxSizePerMsg = 1 << 20
	}
	if out.MaxInflightMsgs <= 0 {
		out.MaxInflightMsgs = 256
	}
	if out.Logger == nil {
		out.Logger = zap.NewNop()
	}
	if out.SnapshotEntries == 0 {
		out.SnapshotEntries = 10_000
	}
	if out.CatchUpEntries == 0 {
		out.CatchUpEntries = min(out.SnapshotEntries/2, 5_000)
	}
	return out
}

// checkRequired returns an error naming the first required field missing.
func (c *Config) checkRequired() error {
	for _, f := range []struct {
		name    string
		missing bool
	}{{"ID", c.ID == 0}, {"Storage", c.Storage == nil}, {"Transport", c.Transport == nil}, {"StateMachine", c.StateMachine == nil}} {
		if f.missing {
			return fmt.Errorf("raftnode: Config.%s is required", f.name)
		}
	}
	return nil
}

// checkPeers checks the Peers a fresh log is bootstrapped with: raft would
// silently drop a zero ID and a duplicate, and a node whose ID is not among
// them is no voter (it could never campaign or count towards a quorum).
func (c *Config) checkPeers() error {
	if len(c.Peers) == 0 {
		return errors.New("raftnode: Config.Peers: no voters to bootstrap an empty log with")
	}
	seen := make(map[uint64]bool, len(c.Peers))
	for _, id := range c.Peers {
		switch {
		case id == 0:
			return errors.New("raftnode: Config.Peers: member ID 0 is not valid")
		case seen[id]:
			return fmt.Errorf("raftnode: Config.Peers: member ID %d is listed twice", id)
		}
		seen[id] = true
	}
	if !seen[c.ID] {
		return fmt.Errorf("raftnode: Config.Peers %v does not hold this node's ID %d", c.Peers, c.ID)
	}
	return nil
}

// New creates the node over cfg.Storage, bootstrapping an empty log with
// cfg.Peers. It does not start the node's goroutine: call Start.
//
// Errors: ErrCorruptState when raft cannot start from the stored log and
// hard state, or cfg.StateMachine refuses the stored snapshot (Restore);
// the storage's error when a read of it fails; an error naming the field
// when ID, Storage, Transport or StateMachine is missing, or raft refuses
// the configuration (for example ElectionTicks not above HeartbeatTicks)
// or, for an empty log, an error naming Peers when they are empty, hold
// ID 0 or an ID twice, or do not hold ID.
func New(cfg Config) (*Node, error) {
	cfg = cfg.withDefaults()
	if err := cfg.checkRequired(); err != nil {
		return nil, err
	}
	snap, err := cfg.Storage.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("raftnode: reading snapshot: %w", err)
	}
	var confState *raftpb.ConfState
	if !raft.IsEmptySnap(snap) {
		md := snap.GetMetadata()
		if err := cfg.StateMachine.Restore(md.GetIndex(), snap.GetData()); err != nil {
			return nil, fmt.Errorf("%w: restoring snapshot at index %d: %w", ErrCorruptState, md.GetIndex(), err)
		}
		cfg.Applied = md.GetIndex()
		confState = md.GetConfState()
	}
	snapBytes := len(snap.GetData())
	reads := &readGuard{Storage: cfg.Storage}
	rc := &raft.Config{
		ID:                        cfg.ID,
		ElectionTick:              cfg.ElectionTicks,
		HeartbeatTick:             cfg.HeartbeatTicks,
		Storage:                   reads,
		Applied:                   cfg.Applied,
		MaxSizePerMsg:             cfg.MaxSizePerMsg,
		MaxInflightMsgs:           cfg.MaxInflightMsgs,
		MaxUncommittedEntriesSize: 64 << 20,
		CheckQuorum:               true,
		PreVote:                   true,
		ReadOnlyOption:            raft.ReadOnlySafe,
		// Requests reach the leader through the client API; a proposal made
		// by a replica that has just lost leadership must fail rather than be
		// forwarded, so that a leader's timing decision (an expiry) is never
		// logged in another leader's term.
		DisableProposalForwarding: true,
		Logger:                    &zapRaftLogger{cfg.Logger.Sugar()},
	}
	rn, err := newRawNode(rc)
	if err != nil {
		return nil, fmt.Errorf("raftnode: %w", err)
	}
	last, err := cfg.Storage.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("raftnode: reading log: %w", err)
	}
	hs, _, err := cfg.Storage.InitialState()
	if err != nil {
		return nil, fmt.Errorf("raftnode: reading log: %w", err)
	}
	if last == 0 && raft.IsEmptyHardState(hs) {
		if err := cfg.checkPeers(); err != nil {
			return nil, err
		}
		peers := make([]raft.Peer, len(cfg.Peers))
		for i, id := range cfg.Peers {
			peers[i] = raft.Peer{ID: id}
		}
		if err := rn.Bootstrap(peers); err != nil {
			return nil, fmt.Errorf("raftnode: bootstrap: %w", err)
		}
	}
	n := &Node{
		cfg:       cfg,
		rn:        rn,
		reads:     reads,
		log:       cfg.Logger,
		clk:       cfg.Clock,
		propc:     make(chan proposal, 4096),
		wakec:     make(chan struct{}, 1),
		recvc:     make(chan *raftpb.Message, 4096),
		readc:     make(chan *readRequest, 1024),
		reportc:   make(chan report, 256),
		stopc:     make(chan struct{}),
		donec:     make(chan struct{}),
		applied:   cfg.Applied,
		inflight:  make(map[uint64]*readRound),
		heard:     make(map[uint64]uint64),
		snapc:     make(chan snapResult, 1),
		noticec:   make(chan struct{}, 1),
		notices:   make(map[uint64]*raftpb.Message),
		snapIndex: cfg.Applied,
		// Read rounds are numbered from a random start, so that a
		// restarted node's rounds never take the numbers of its previous
		// incarnation's: the leader's late answer to one of those (an
		// index from before the new round) must not resolve a new round.
		readSeq:   rand.Uint64(),
		snapBytes: snapBytes,
		confState: confState,
	}
	lc := make(chan struct{})
	n.leaderC.Store(&lc)
	n.publishStatus()
	return n, nil
}

// Start runs the node's goroutine. Only the first call does: a later one,
// or one after Stop, does nothing.
func (n *Node) Start() {
	if n.started.CompareAndSwap(false, true) {
		go n.run()
	}
}

// Stop stops the node's goroutine and waits for it. Idempotent. On a node
// that was never started it only marks the node stopped: Done closes and
// every call returns ErrStopped.
func (n *Node) Stop() {
	n.stop.Do(func() {
		close(n.stopc)
		if n.started.CompareAndSwap(false, true) {
			close(n.donec)
		}
	})
	<-n.donec
}

// Done is closed when the node's goroutine has exited.
func (n *Node) Done() <-chan struct{} { return n.donec }

// Err returns the fatal error that stopped the node, if any.
func (n *Node) Err() error {
	n.errMu.Lock()
	defer n.errMu.Unlock()
	return n.err
}

// Status returns the latest published raft state. A stopped node keeps the
// state it last published, which may still name itself leader (LeaderLost
// was called when it stopped): check Done or Err before trusting it.
func (n *Node) Status() Status { return *n.status.Load() }

// LeaderChanged returns a channel that is closed at the next change of the
// known leader, the term, or the leadership transfer under way on this
// leader (Status.LeadTransferee: one started, switched, or ended, also
// when raft abandons it).
func (n *Node) LeaderChanged() <-chan struct{} { return *n.leaderC.Load() }

// Step hands a message received from a peer to raft. It never blocks: when
// the node is overloaded the message is dropped (raft retransmits).
func (n *Node) Step(m *raftpb.Message) {
	select {
	case n.recvc <- m:
	default:
	}
}

// ReportUnreachable tells raft that a message to id was not delivered. It
// never blocks.
func (n *Node) ReportUnreachable(id uint64) {
	select {
	case n.reportc <- report{unreachable: id}:
	default:
	}
}

// newRawNode creates the raw node, turning raft's panics on an inconsistent
// log (a commit index outside the log, say) into an error: a replica whose
// storage is damaged refuses to start rather than crash (DESIGN.md, bad
// input).
func newRawNode(rc *raft.Config) (rn *raft.RawNode, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: inconsistent raft state in the log: %v", ErrCorruptState, r)
		}
	}()
	return raft.NewRawNode(rc)
}

// readGuard is the raft.Storage that raft reads the log through. raft
// panics on any read error other than its own ErrCompacted, ErrUnavailable
// and ErrSnapshotTemporarilyUnavailable (raftLog.slice, raftLog.term,
// maybeSendSnapshot), and a disk that fails a read (EIO) or a block whose
// checksum fails would end the whole process there. readGuard records the
// first such error before raft sees it, so that run can tell that panic
// from a bug and stop the node with the error instead. The node never uses
// raft again after the panic; nothing was written.
type readGuard struct {
	raft.Storage
	mu  sync.Mutex
	err error
}

func (g *readGuard) check(err error) error {
	if err == nil || err == raft.ErrCompacted || err == raft.ErrUnavailable || err == raft.ErrSnapshotTemporarilyUnavailable {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		g.err = err
	}
	return err
}

// failure returns the first unexpected read error, or nil.
func (g *readGuard) failure() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

func (g *readGuard) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	hs, cs, err := g.Storage.InitialState()
	return hs, cs, g.check(err)
}

func (g *readGuard) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	ents, err := g.Storage.Entries(lo, hi, maxSize)
	return ents, g.check(err)
}

func (g *readGuard) Term(i uint64) (uint64, error) {
	t, err := g.Storage.Term(i)
	return t, g.check(err)
}

func (g *readGuard) LastIndex() (uint64, error) {
	i, err := g.Storage.LastIndex()
	return i, g.check(err)
}

func (g *readGuard) FirstIndex() (uint64, error) {
	i, err := g.Storage.FirstIndex()
	return i, g.check(err)
}

func (g *readGuard) Snapshot() (*raftpb.Snapshot, error) {
	snap, err := g.Storage.Snapshot()
	return snap, g.check(err)
}

// ReportSnapshot tells raft whether a snapshot sent to id arrived. It never
// blocks.
func (n *Node) ReportSnapshot(id uint64, status raft.SnapshotStatus) {
	select {
	case n.reportc <- report{snapshot: id, status: status}:
	default:
	}
}

// Propose submits data as a new log entry. It returns once raft has accepted
// the proposal into this leader's log (not when it commits): ErrNotLeader if
// this node is not the leader, ErrStopped, or ctx's error. Whether and when
// the entry commits is observed through StateMachine.Apply.
func (n *Node) Propose(ctx context.Context, data []byte) error {
	return n.submit(ctx, proposal{data: data, errc: make(chan error, 1)})
}

// AsyncProposal is an entry for ProposeAsync.
type AsyncProposal struct {
	// Data is the entry's payload.
	Data []byte
	// Deferred and Epoch: the entry may be held as ProposeDeferred holds
	// it, with Epoch as its epoch argument.
	Deferred bool
	Epoch    uint64
	// Refused, when set, is called if raft refuses the entry, with the
	// error Propose would have returned (ErrNotLeader). It runs on the
	// node's goroutine: it must not block or call into the node.
	Refused func(error)
}

// ProposeAsync is Propose (or ProposeDeferred) without the wait for raft
// to take the entry: it returns once the entry is in the node's queue, or
// with ctx's error or ErrStopped if it could not be queued. What happens
// next is reported by StateMachine.Apply when the entry commits, or by
// p.Refused. An entry still queued or held when the node stops is neither
// applied nor refused: a caller waiting for either also watches Done.
//
// Why: a caller that waits for the entry's apply anyway (the lock
// service's requests) saves a channel and a wake-up of its goroutine per
// request.
func (n *Node) ProposeAsync(ctx context.Context, p AsyncProposal) error {
	return n.enqueue(ctx, proposal{data: p.Data, deferred: p.Deferred, epoch: p.Epoch, refused: p.Refused})
}

// enqueue hands p to the loop. A stopped node's queue still has room, and
// select picks among ready cases at random: without the first check a
// ProposeAsync after Stop would report every other entry as queued.
func (n *Node) enqueue(ctx context.Context, p proposal) error {
	select {
	case <-n.donec:
		return ErrStopped
	default:
	}
	select {
	case n.propc <- p:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.donec:
		return ErrStopped
	}
}

// submit hands p to the loop and waits for its answer on p.errc.
func (n *Node) submit(ctx context.Context, p proposal) error {
	if err := n.enqueue(ctx, p); err != nil {
		return err
	}
	select {
	case err := <-p.errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-n.donec:
		return ErrStopped
	}
}

// ProposeDeferred is Propose for an entry that is in no hurry: one whose
// effect, the proposer knows, waits on an entry that has not been proposed
// yet (in quorumlock: an acquire of a lock another session holds, which
// can only be granted by a later release or expiry). The leader holds it
// until the next Propose, which takes the held entries first (so the log
// keeps arrival order and they share that proposal's append message and
// fsync on every follower), until ReleaseDeferred, until the next tick, or
// until leadership is lost (then ErrNotLeader). Holding an entry is thus
// the same as a slower path to the leader: the log order is unchanged.
//
// Why: with a contended lock, the holder's release and the previous
// holder's re-queued acquire reach the leader a fraction of an fsync
// apart; proposed one by one, each follower syncs them one after the other
// and every hand-off waits for two fsyncs instead of one.
//
// A non-leader does not hold: it answers ErrNotLeader at once. It returns
// as Propose does, once raft has accepted the entry into the log.
//
// epoch is DeferEpoch as read when the caller decided that the entry may
// wait. If ReleaseDeferred was called since (the reason to wait may be
// gone, and that call found the entry not yet held: it had not reached the
// node's loop), the entry is not held.
func (n *Node) ProposeDeferred(ctx context.Context, data []byte, epoch uint64) error {
	return n.submit(ctx, proposal{data: data, errc: make(chan error, 1), deferred: true, epoch: epoch})
}

// DeferEpoch returns the number of ReleaseDeferred calls so far; see
// ProposeDeferred.
func (n *Node) DeferEpoch() uint64 { return n.releaseEpoch.Load() }

// ReleaseDeferred proposes every held deferred entry (ProposeDeferred) at
// the loop's next turn. It never blocks and may be called from
// StateMachine callbacks.
func (n *Node) ReleaseDeferred() {
	n.releaseEpoch.Add(1)
	select {
	case n.wakec <- struct{}{}:
	default:
	}
}

// ReadIndex returns an index such that once the state machine has applied
// it, a read reflects every write acknowledged before ReadIndex was called
// (raft thesis §6.4). The confirmation round it waits for is issued after the
// call started, so a leader that answers has been leader at some moment after
// the call began (DESIGN.md invariant 4). Concurrent calls share one round.
// On a follower the round goes through the leader. It blocks until answered,
// ctx ends (ctx's error), or the node stops (ErrStopped); rounds without an
// answer for an election timeout are retried.
func (n *Node) ReadIndex(ctx context.Context) (uint64, error) {
	return n.readIndex(ctx, &readRequest{done: make(chan struct{})})
}

func (n *Node) readIndex(ctx context.Context, r *readRequest) (uint64, error) {
	select {
	case n.readc <- r:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.donec:
		return 0, ErrStopped
	}
	select {
	case <-r.done:
		return r.index, r.err
	case <-ctx.Done():
		r.abandoned.Store(true)
		return 0, ctx.Err()
	case <-n.donec:
		return 0, ErrStopped
	}
}

// WaitApplied blocks until the state machine has applied index (nil), ctx
// ends (ctx's error), or the node stops (ErrStopped).
func (n *Node) WaitApplied(ctx context.Context, index uint64) error {
	n.appliedMu.Lock()
	if n.applied >= index {
		n.appliedMu.Unlock()
		return nil
	}
	c := make(chan struct{})
	n.appliedW = append(n.appliedW, appliedWaiter{index, c})
	n.appliedMu.Unlock()
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.donec:
		return ErrStopped
	}
}

// LinearizableRead is ReadIndex followed by WaitApplied of its index: it
// returns nil once this node's state machine reflects every write
// acknowledged before the call (raft thesis §6.4), on a follower too. It
// blocks until then, ctx ends (ctx's error), or the node stops
// (ErrStopped).
func (n *Node) LinearizableRead(ctx context.Context) error {
	idx, err := n.ReadIndex(ctx)
	if err != nil {
		return err
	}
	return n.WaitApplied(ctx, idx)
}

// TransferLeadership asks raft to hand leadership to id (used by tests and
// operators). It never blocks: when the node's queue is full the request
// is dropped.
func (n *Node) TransferLeadership(id uint64) {
	select {
	case n.propc <- proposal{data: nil, errc: nil, transfer: id}:
	default:
	}
}

// Resign hands leadership to another voter and waits until a member other
// than this one leads: the leadership transfer of the raft thesis §3.10
// (MsgTimeoutNow: the transferee campaigns at once, without waiting for an
// election timeout), which etcd's server also makes before it stops. The
// candidates are the voters this node received a message from within the
// last election timeout and whose connection the transport has not
// reported broken since (etcd likewise picks among connected members);
// among them, those heard from within about a heartbeat interval come
// first, then the longest log (match index). A voter that crashed is picked
// only in the moments before either the transport notices or an election
// timeout passes. Without a new leader the pick is made again every
// 2×HeartbeatTicks+2 ticks, but a transfer under way stays with a
// transferee that is still being caught up while it keeps answering and
// the new pick's log is no longer than its own. While the transfer runs,
// raft refuses proposals (Propose returns ErrNotLeader); raft abandons a
// transfer that has not finished within an election timeout and this node
// stays leader.
//
// It returns nil once another member leads, ErrNotLeader when this node is
// not the leader when called, ErrNoTransferee when no other voter is
// reachable then (later picks that find none are retried until ctx ends),
// ctx's error when ctx ends first and ErrStopped when the node stops.
func (n *Node) Resign(ctx context.Context) error {
	leaderC := n.LeaderChanged()
	if err := n.submit(ctx, proposal{resign: true, errc: make(chan error, 1)}); err != nil {
		return err
	}
	// A transferee that crashed an instant before is still reachable by
	// the rules above until its silence shows; every few heartbeats
	// without a new leader the choice is made again (resign), and raft
	// switches the transfer when that picks another.
	retry := n.clk.NewTicker(time.Duration(n.resignRetryTicks()) * n.cfg.TickInterval)
	defer retry.Stop()
	for {
		if st := n.Status(); st.Leader != 0 && st.Leader != n.cfg.ID {
			return nil
		}
		select {
		case <-leaderC:
			leaderC = n.LeaderChanged()
		case <-retry.C():
			err := n.submit(ctx, proposal{resign: true, errc: make(chan error, 1)})
			if errors.Is(err, ErrStopped) || ctx.Err() != nil {
				return cmp.Or(ctx.Err(), err)
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-n.donec:
			return ErrStopped
		}
	}
}

// silence returns how many ticks ago a message from peer id arrived; ok is
// false when none has since the transport last reported its connection
// broken. (raft's RecentActive is no substitute: CheckQuorum clears it for
// every peer once per election timeout until their next answers arrive,
// and a broken connection does not clear it.)
func (n *Node) silence(id uint64) (ticks uint64, ok bool) {
	at, ok := n.heard[id]
	return n.ticks - at, ok
}

// resignRetryTicks is how many ticks Resign waits for a new leader before
// it makes its pick again.
func (n *Node) resignRetryTicks() uint64 { return uint64(2*n.cfg.HeartbeatTicks + 2) }

// resign picks Resign's transferee and starts the transfer.
//
// A transfer under way is left to run while its transferee is still being
// caught up (its match index is below this leader's), was heard from
// within the last retry period (resignRetryTicks), and is at least as far
// along as the new pick: a new pick makes raft abort the transfer and
// start over with another, and picking afresh at every retry let a leader
// under load (its transferee, the one with the longer log, not heard from
// within a heartbeat interval for a moment) switch between its followers
// until the time Close gives the transfer ran out (seen in
// TestRollingRestartRemote under -race with two busy cores). Otherwise
// the pick is made afresh: a transferee that caught up has been sent
// MsgTimeoutNow already, so a new pick loses no work when it has not taken
// over by now (it may have frozen); one silent for the whole period may
// have crashed; and one behind the new pick is farther from done (raft
// refuses proposals during the transfer). raft abandons a transfer that
// has not finished within an election timeout, after which the pick is
// free again.
func (n *Node) resign() error {
	st := n.rn.Status()
	if st.RaftState != raft.StateLeader {
		return ErrNotLeader
	}
	// Preference: heard from within the last heartbeat interval or so (a
	// live follower answers every heartbeat; one that has just crashed
	// falls silent), then the longest log, then the lowest ID.
	var best, bestMatch uint64
	bestFresh := false
	for id, pr := range st.Progress {
		silent, ok := n.silence(id)
		if id == n.cfg.ID || pr.IsLearner || !ok || silent >= uint64(n.cfg.ElectionTicks) {
			continue
		}
		fresh := silent <= uint64(n.cfg.HeartbeatTicks)+1
		if best == 0 || fresh && !bestFresh ||
			fresh == bestFresh && (pr.Match > bestMatch || pr.Match == bestMatch && id < best) {
			best, bestMatch, bestFresh = id, pr.Match, fresh
		}
	}
	if t := st.LeadTransferee; t != 0 && t != best {
		match := st.Progress[t].Match
		if silent, ok := n.silence(t); ok && silent < n.resignRetryTicks() &&
			match >= bestMatch && match < st.Progress[n.cfg.ID].Match {
			return nil // the transfer under way goes on
		}
	}
	if best == 0 {
		return ErrNoTransferee
	}
	n.log.Info("handing leadership over", zap.Uint64("to", best), zap.Uint64("match", bestMatch))
	n.rn.TransferLeader(best)
	return nil
}

func (n *Node) run() {
	defer close(n.donec)
	ticker := n.clk.NewTicker(n.cfg.TickInterval)
	defer ticker.Stop()
	defer n.dropNotices()
	defer func() {
		if n.isLeader {
			n.isLeader = false
			n.cfg.StateMachine.LeaderLost()
		}
		n.failReads(ErrStopped)
	}()
	defer func() {
		// raft panics on a log read error it does not expect (readGuard):
		// the node stops with that error, as on a failed write. raft also
		// panics on a peer's message that contradicts this replica's log,
		// such as a heartbeat whose commit index is past the last entry
		// ("tocommit out of range"), which no correct leader sends: a
		// forged message, or a peer that lost its state. That stops this
		// replica (ErrBadMessage), not the process around it; nothing of
		// the message was saved (saves happen in Ready). Any other panic
		// is a bug and goes on.
		if r := recover(); r != nil {
			if err := n.reads.failure(); err != nil {
				n.fail(fmt.Errorf("raftnode: reading the log: %w", err))
				return
			}
			m := n.stepping
			if m == nil {
				panic(r)
			}
			n.log.Error("raft panicked on a peer's message", zap.Stack("stack"))
			n.fail(fmt.Errorf("%w: %v from member %d (term %d, index %d, commit %d): %v",
				ErrBadMessage, m.GetType(), m.GetFrom(), m.GetTerm(), m.GetIndex(), m.GetCommit(), r))
		}
	}()
	for {
		select {
		case <-ticker.C():
			n.ticks++
			// A held entry waits at most one tick (ProposeDeferred).
			n.releaseHeld()
			n.rn.Tick()
			n.tickReads()
			n.campaignIfSuspect()
		case p := <-n.propc:
			n.propose(p)
		case m := <-n.recvc:
			n.step(m)
		case r := <-n.readc:
			n.pending = append(n.pending, r)
		case rep := <-n.reportc:
			n.report(rep)
		case r := <-n.snapc:
			if err := n.saveSnapshot(r); err != nil {
				n.fail(err)
				return
			}
		case <-n.wakec:
		case <-n.noticec:
			n.sendNotices()
		case <-n.stopc:
			return
		}
		// Take everything else that is queued, so that one Ready (one
		// fsync) carries every proposal and answer that arrived while the
		// last one was being written, and queued reads share one round.
		n.drain()
		// Applying a Ready may ask for the held entries (ReleaseDeferred)
		// or lose leadership (they fail): they are taken before the next.
		for {
			if e := n.releaseEpoch.Load(); e != n.releasedAt {
				n.releasedAt = e
				n.releaseHeld()
			}
			n.flushProposals()
			n.issueReads()
			if !n.rn.HasReady() {
				break
			}
			if err := n.handleReady(); err != nil {
				n.fail(err)
				return
			}
		}
	}
}

// drain handles every proposal, message, read and report queued now,
// without blocking.
func (n *Node) drain() {
	for {
		select {
		case p := <-n.propc:
			n.propose(p)
		case m := <-n.recvc:
			n.step(m)
		case r := <-n.readc:
			n.pending = append(n.pending, r)
		case rep := <-n.reportc:
			n.report(rep)
		default:
			return
		}
	}
}

func (n *Node) report(rep report) {
	if rep.snapshot != 0 {
		n.rn.ReportSnapshot(rep.snapshot, rep.status)
		return
	}
	// The messages queued now arrived before the report (the transport
	// reports a stream broken after delivering what came through it): step
	// them first, so that the dead leader's last heartbeat, handled after
	// the report, does not pass for a sign of life and cancel the
	// suspicion.
	for range len(n.recvc) {
		n.step(<-n.recvc)
	}
	n.rn.ReportUnreachable(rep.unreachable)
	delete(n.heard, rep.unreachable)
	if bs := n.rn.BasicStatus(); bs.RaftState == raft.StateFollower && bs.Lead == rep.unreachable {
		n.suspect, n.suspectAt = bs.Lead, bs.GetTerm()
	}
}

// campaignIfSuspect runs on every tick. A follower whose connection to its
// leader broke (the leader's process exited or its host reset the
// connection) campaigns once, when it has not heard from the leader for two
// heartbeat intervals plus a stagger of (ID-1) mod ElectionTicks ticks,
// instead of waiting for its randomized election timeout (one to two
// election timeouts); raft's own timer takes over after that. It is safe:
// the campaign is a pre-vote, which the other followers refuse while they
// still hear from the leader within an election timeout (CheckQuorum's
// lease), and which bumps no term when refused.
//
// The silence condition keeps a broken connection to a leader that still
// reaches this follower from making it a pre-candidate (which forgets the
// leader until its next message: reads and forwarded requests would stall
// meanwhile). The stagger, and campaigning once, keep followers that all
// lost the leader from pre-voting each other in the same tick and then
// splitting the vote: the first to campaign is refused (the others are
// still in the lease) and stays a pre-candidate, so the next one's pre-vote
// and vote succeed. So a crashed leader is replaced a few ticks after its
// last heartbeat.
//
// A pre-candidate made so that then refuses another follower's pre-vote
// (raft refuses one whose log is behind its own) campaigns again at the
// next tick: that follower has given up the leader too, so it now grants
// the pre-vote it refused under its lease. Without that, a first
// campaigner with the longer log and a second with the shorter one refuse
// each other, and both wait for raft's election timer (seen in the
// benchmark's failover: 1.3-1.9 s instead of about 0.45 s).
func (n *Node) campaignIfSuspect() {
	n.silent++
	if n.lostTerm != 0 {
		bs := n.rn.BasicStatus()
		if bs.RaftState != raft.StatePreCandidate || bs.GetTerm() != n.lostTerm {
			n.lostTerm, n.recampaign = 0, false
		} else if n.recampaign {
			n.recampaign = false
			if err := n.rn.Campaign(); err != nil {
				n.log.Debug("campaign again after refusing a pre-vote", zap.Error(err))
			}
		}
	}
	if n.suspect == 0 {
		return
	}
	bs := n.rn.BasicStatus()
	if bs.GetTerm() != n.suspectAt || bs.RaftState != raft.StateFollower || bs.Lead != n.suspect {
		n.suspect = 0
		return
	}
	if n.silent <= 2*n.cfg.HeartbeatTicks+int((n.cfg.ID-1)%uint64(n.cfg.ElectionTicks)) {
		return
	}
	n.suspect = 0
	if err := n.rn.Campaign(); err != nil {
		n.log.Debug("campaign after losing the leader's connection", zap.Error(err))
		return
	}
	n.lostTerm = bs.GetTerm()
}

// fail records the error that stops the node: a storage error, or
// ErrBadMessage.
func (n *Node) fail(err error) {
	n.errMu.Lock()
	n.err = err
	n.errMu.Unlock()
	n.log.Error("raft node stopping", zap.Error(err))
	if n.cfg.OnFatal != nil {
		n.cfg.OnFatal(err)
	}
}

// maybeSnapshot starts a snapshot once SnapshotEntries entries have been
// applied since the last one. The state machine captures its state here;
// the image is written on another goroutine and saved by saveSnapshot.
func (n *Node) maybeSnapshot(applied uint64) {
	if n.snapping || n.confState == nil || !snapshotDue(applied-min(applied, n.snapIndex), n.sinceSnap, n.snapBytes, n.cfg.SnapshotEntries) {
		return
	}
	index, write := n.cfg.StateMachine.Snapshot()
	term, err := n.cfg.Storage.Term(index)
	if err != nil {
		n.log.Warn("snapshot skipped", zap.Uint64("index", index), zap.Error(err))
		return
	}
	n.snapping = true
	n.sinceSnap = 0
	conf := proto.Clone(n.confState).(*raftpb.ConfState)
	go func() {
		var buf bytes.Buffer
		err := write(&buf)
		select {
		case n.snapc <- snapResult{index: index, term: term, conf: conf, data: buf.Bytes(), err: err}:
		case <-n.stopc:
		}
	}()
}

// snapshotDue reports whether a snapshot is due after entries entries with
// payload bytes were applied since the last one, whose image had lastImage
// bytes: at least every entries, and not before the payload reaches a
// quarter of the last image (see Config.SnapshotEntries).
func snapshotDue(entries uint64, payload, lastImage int, every uint64) bool {
	return entries >= every && payload >= lastImage/4
}

// saveSnapshot makes a written snapshot durable, then compacts the log
// behind it, keeping CatchUpEntries (a snapshot is durable before the log
// it replaces is truncated: invariant 10). A write error of the image is
// logged and the snapshot skipped; a storage error stops the node.
func (n *Node) saveSnapshot(r snapResult) error {
	n.snapping = false
	if r.err != nil {
		n.log.Warn("writing snapshot failed", zap.Uint64("index", r.index), zap.Error(r.err))
		return nil
	}
	if r.index <= n.snapIndex {
		return nil // a newer snapshot arrived from the leader meanwhile
	}
	snap := &raftpb.Snapshot{
		Data:     r.data,
		Metadata: &raftpb.SnapshotMetadata{Index: new(r.index), Term: new(r.term), ConfState: r.conf},
	}
	n.failpoint(FailpointBeforeSnapshotSave)
	if err := n.cfg.Storage.SaveSnapshot(snap); err != nil {
		return fmt.Errorf("raftnode: saving snapshot at %d: %w", r.index, err)
	}
	n.failpoint(FailpointAfterSnapshotSave)
	n.snapIndex = r.index
	n.snapBytes = len(r.data)
	if r.index > n.cfg.CatchUpEntries {
		if err := n.cfg.Storage.Compact(r.index - n.cfg.CatchUpEntries); err != nil && !errors.Is(err, raft.ErrCompacted) {
			return fmt.Errorf("raftnode: compacting to %d: %w", r.index-n.cfg.CatchUpEntries, err)
		}
	}
	n.log.Info("snapshot saved", zap.Uint64("index", r.index), zap.Int("bytes", len(r.data)))
	if n.cfg.OnSnapshot != nil {
		n.cfg.OnSnapshot(len(r.data))
	}
	return nil
}

// propose queues a data proposal for flushProposals, or carries out a
// transfer request after the proposals queued before it.
func (n *Node) propose(p proposal) {
	if p.deferred && p.epoch == n.releaseEpoch.Load() && n.rn.BasicStatus().RaftState == raft.StateLeader {
		n.held = append(n.held, p)
		return
	}
	// Held entries arrived first: they go first.
	n.releaseHeld()
	if !p.resign && p.transfer == 0 {
		n.props = append(n.props, p)
		return
	}
	n.flushProposals()
	if p.resign {
		p.errc <- n.resign()
		return
	}
	n.rn.TransferLeader(p.transfer)
}

// releaseHeld moves the held deferred proposals, in arrival order, to the
// proposals of this turn.
func (n *Node) releaseHeld() {
	if len(n.held) == 0 {
		return
	}
	n.props = append(n.props, n.held...)
	clear(n.held)
	n.held = n.held[:0]
}

// flushProposals hands the queued proposals to raft as one MsgProp: raft
// appends them together and sends each follower one MsgApp for all of
// them (a MsgProp per proposal would make a MsgApp, and a MsgAppResp, per
// proposal and follower). They are accepted or refused together
// (ErrNotLeader: not the leader, a leadership transfer under way, or too
// much uncommitted).
func (n *Node) flushProposals() {
	if len(n.props) == 0 {
		return
	}
	var err error
	if n.rn.BasicStatus().RaftState != raft.StateLeader {
		err = ErrNotLeader
	} else {
		ents := make([]*raftpb.Entry, len(n.props))
		for i, p := range n.props {
			ents[i] = &raftpb.Entry{Data: p.data}
		}
		err = n.rn.Step(&raftpb.Message{Type: raftpb.MessageType_MsgProp.Enum(), From: new(n.cfg.ID), Entries: ents})
		if errors.Is(err, raft.ErrProposalDropped) {
			err = ErrNotLeader
		}
	}
	for i, p := range n.props {
		switch {
		case p.errc != nil:
			p.errc <- err
		case err != nil && p.refused != nil:
			p.refused(err)
		}
		n.props[i] = proposal{}
	}
	n.props = n.props[:0]
}

// step hands a peer's message to raft. Local message types never come
// from a peer, and neither do proposals: forwarding is off
// (DisableProposalForwarding), so a MsgProp on the wire is a forged or
// broken peer's, which a leader would append to the log.
func (n *Node) step(m *raftpb.Message) {
	if t := m.GetType(); raft.IsLocalMsg(t) || t == raftpb.MsgProp {
		return
	}
	if n.suspect != 0 && m.GetFrom() == n.suspect && m.GetTerm() >= n.suspectAt {
		n.suspect = 0 // it is alive and still leads, or has moved on
	}
	if m.GetFrom() == n.status.Load().Leader {
		n.silent = 0
	}
	n.heard[m.GetFrom()] = n.ticks
	n.stepping = m
	err := n.rn.Step(m)
	n.stepping = nil
	if err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
		n.log.Debug("raft step", zap.Error(err))
	}
}

func (n *Node) issueReads() {
	if len(n.pending) == 0 {
		return
	}
	if n.pending = keepReads(n.pending); len(n.pending) == 0 {
		return
	}
	n.readSeq++
	n.inflight[n.readSeq] = &readRound{reqs: n.pending}
	n.pending = nil
	var ctx [8]byte
	binary.BigEndian.PutUint64(ctx[:], n.readSeq)
	n.rn.ReadIndex(ctx[:])
}

// tickReads retries rounds that went unanswered for an election timeout
// (raft drops a read index request silently when there is no leader).
//
// Its requests go on to a new round (timed-out rounds share one), but the
// old round is retired, not dropped: it was only slow, perhaps, and its
// answer, should it come within retiredReadTimeouts election timeouts of
// its issue, answers them as well as the new round's would (it was issued after each
// of them arrived, so it confirms a leadership after the calls began).
// Dropping it made a late answer useless: with a round trip to the leader
// longer than an election timeout, every round was replaced before its
// answer came and the replica's reads never returned.
func (n *Node) tickReads() {
	for seq, r := range n.inflight {
		r.issued++
		switch {
		case r.retired:
			if r.issued >= retiredReadTimeouts*n.cfg.ElectionTicks {
				delete(n.inflight, seq)
			}
		case r.issued >= n.cfg.ElectionTicks:
			r.retired = true
			if r.reqs = keepReads(r.reqs); len(r.reqs) == 0 {
				delete(n.inflight, seq)
				continue
			}
			// The new round gets copies of the pointers: keepReads
			// compacts a round's slice in place.
			n.pending = append(n.pending, r.reqs...)
		}
	}
}

// keepReads returns the requests of reqs whose callers still wait, in
// reqs' backing array; the abandoned ones are closed. Without it, a
// replica that finds no leader for long (a partition) carried every read
// ever asked of it from one retried round to the next: memory, and a
// round's work, growing with each call whose ctx ended meanwhile.
func keepReads(reqs []*readRequest) []*readRequest {
	kept := reqs[:0]
	for _, q := range reqs {
		if q.finished {
			continue
		}
		if q.abandoned.Load() {
			q.finish(0, context.Canceled)
			continue
		}
		kept = append(kept, q)
	}
	clear(reqs[len(kept):])
	return kept
}

func (n *Node) failReads(err error) {
	for seq, r := range n.inflight {
		delete(n.inflight, seq)
		for _, q := range r.reqs {
			q.finish(0, err)
		}
	}
	for _, q := range n.pending {
		q.finish(0, err)
	}
	n.pending = nil
}

// failpoint calls Config.Failpoint, if set.
func (n *Node) failpoint(point string) {
	if n.cfg.Failpoint != nil {
		n.cfg.Failpoint(point)
	}
}

// handleReady runs one Ready through the raft contract. A follower (or
// candidate) saves the Ready's snapshot, hard state and entries, then sends
// its messages (acknowledgements and votes must not leave before what they
// promise is durable), then applies the committed entries. A leader sends
// first, so that followers write the new entries while the leader does
// (raft thesis §10.2.1; etcd does the same): raft counts the leader's own
// copy towards a quorum only once Advance reports it saved. It also applies
// before saving: every entry a leader sees committed was already durable in
// its own log, so a commit is answered without waiting for the fsync of the
// entries proposed meanwhile.
func (n *Node) handleReady() error {
	rd := n.rn.Ready()
	if rd.SoftState != nil {
		n.state = rd.SoftState.RaftState
	}
	n.failpoint(FailpointBeforeSave)
	if n.state == raft.StateLeader && raft.IsEmptySnap(rd.Snapshot) {
		early, late := splitAfterAppend(rd.Messages)
		n.send(n.holdNotices(early))
		n.commit(&rd)
		if err := n.save(&rd); err != nil {
			return err
		}
		if len(late) > 0 {
			n.cfg.Transport.Send(late)
		}
	} else {
		n.dropNotices()
		if err := n.save(&rd); err != nil {
			return err
		}
		n.send(rd.Messages)
		n.commit(&rd)
	}
	n.rn.Advance(rd)
	n.publishStatus()
	return nil
}

// save makes the Ready's snapshot (one received from the leader: checked
// by the state machine if it is a SnapshotVerifier, then made durable, then
// the state machine jumps to it), hard state and entries durable.
func (n *Node) save(rd *raft.Ready) error {
	if !raft.IsEmptySnap(rd.Snapshot) {
		md := rd.Snapshot.GetMetadata()
		if v, ok := n.cfg.StateMachine.(SnapshotVerifier); ok {
			if err := v.VerifySnapshot(md.GetIndex(), rd.Snapshot.GetData()); err != nil {
				return fmt.Errorf("raftnode: refusing snapshot at %d from the leader: %w", md.GetIndex(), err)
			}
		}
		n.failpoint(FailpointBeforeSnapshotSave)
		if err := n.cfg.Storage.SaveSnapshot(rd.Snapshot); err != nil {
			return fmt.Errorf("raftnode: saving snapshot at %d: %w", md.GetIndex(), err)
		}
		n.failpoint(FailpointAfterSnapshotSave)
		if err := n.cfg.StateMachine.Restore(md.GetIndex(), rd.Snapshot.GetData()); err != nil {
			return fmt.Errorf("raftnode: restoring snapshot at %d: %w", md.GetIndex(), err)
		}
		n.confState = md.GetConfState()
		n.snapIndex = md.GetIndex()
		n.snapBytes = len(rd.Snapshot.GetData())
		n.sinceSnap = 0
		n.setApplied(md.GetIndex())
	}
	start := time.Now()
	if err := n.cfg.Storage.Save(rd.HardState, rd.Entries); err != nil {
		return fmt.Errorf("raftnode: saving %d entries: %w", len(rd.Entries), err)
	}
	if n.cfg.OnSave != nil && rd.MustSync {
		n.cfg.OnSave(time.Since(start), len(rd.Entries))
	}
	n.failpoint(FailpointAfterSave)
	return nil
}

// splitAfterAppend separates the responses among msgs (append and vote
// responses, which raft queues until the Ready's state is durable: its
// msgsAfterAppend) from the rest. A leader sends the rest before saving;
// the responses it sends (rejections of stale peers) wait for the save like
// everyone's. The common case, no response, does not allocate.
func splitAfterAppend(msgs []*raftpb.Message) (early, late []*raftpb.Message) {
	for i, m := range msgs {
		if isResponse(m.GetType()) {
			early = append(early, msgs[:i]...)
			for _, m := range msgs[i:] {
				if isResponse(m.GetType()) {
					late = append(late, m)
				} else {
					early = append(early, m)
				}
			}
			return early, late
		}
	}
	return msgs, nil
}

func isResponse(t raftpb.MessageType) bool {
	return t == raftpb.MessageType_MsgAppResp || t == raftpb.MessageType_MsgVoteResp || t == raftpb.MessageType_MsgPreVoteResp
}

// holdNotices takes the commit notices (appends without entries) out of a
// leader's msgs and holds them, the latest per follower, for
// CommitNoticeHold; an append with entries among msgs replaces the notice
// held for its follower, carrying a commit index at least as new. It
// returns the messages to send now (msgs itself when nothing is held).
func (n *Node) holdNotices(msgs []*raftpb.Message) []*raftpb.Message {
	if n.cfg.CommitNoticeHold <= 0 {
		return msgs
	}
	var out []*raftpb.Message // non-nil once a notice is held
	for i, m := range msgs {
		if m.GetType() == raftpb.MessageType_MsgApp {
			if len(m.GetEntries()) == 0 {
				if out == nil {
					out = append(make([]*raftpb.Message, 0, len(msgs)), msgs[:i]...)
				}
				n.notices[m.GetTo()] = m
				continue
			}
			delete(n.notices, m.GetTo())
		}
		if out != nil {
			out = append(out, m)
		}
	}
	if out == nil {
		out = msgs
	}
	if len(n.notices) > 0 && n.noticeT == nil {
		n.noticeT = n.clk.AfterFunc(n.cfg.CommitNoticeHold, func() {
			select {
			case n.noticec <- struct{}{}:
			default:
			}
		})
	}
	return out
}

// sendNotices sends the commit notices held when their hold ran out.
func (n *Node) sendNotices() {
	n.noticeT = nil
	if len(n.notices) == 0 {
		return
	}
	msgs := make([]*raftpb.Message, 0, len(n.notices))
	for _, m := range n.notices {
		msgs = append(msgs, m)
	}
	clear(n.notices)
	n.cfg.Transport.Send(msgs)
}

// dropNotices forgets the held commit notices (the node no longer leads,
// or stops) and the timer that would send them.
func (n *Node) dropNotices() {
	clear(n.notices)
	if n.noticeT != nil {
		n.noticeT.Stop()
		n.noticeT = nil
	}
	select {
	case <-n.noticec:
	default:
	}
}

// send hands the Ready's messages to the transport.
func (n *Node) send(msgs []*raftpb.Message) {
	if n.lostTerm != 0 && !n.recampaign {
		for _, m := range msgs {
			if m.GetType() == raftpb.MessageType_MsgPreVoteResp && m.GetReject() {
				n.recampaign = true
				break
			}
		}
	}
	if len(msgs) > 0 {
		n.cfg.Transport.Send(msgs)
	}
	n.failpoint(FailpointAfterSend)
}

// commit reports leadership changes, applies the Ready's committed entries
// and answers the read requests its read states cover.
func (n *Node) commit(rd *raft.Ready) {
	if rd.SoftState != nil || rd.HardState != nil {
		n.leadershipChanged()
	}
	if len(rd.CommittedEntries) > 0 {
		n.apply(rd.CommittedEntries)
	}
	n.failpoint(FailpointAfterApply)
	for _, rs := range rd.ReadStates {
		if len(rs.RequestCtx) != 8 {
			continue
		}
		seq := binary.BigEndian.Uint64(rs.RequestCtx)
		if r, ok := n.inflight[seq]; ok {
			delete(n.inflight, seq)
			for _, q := range r.reqs {
				q.finish(rs.Index, nil)
			}
		}
	}
	// A leader became known (again): rounds issued before may have been
	// dropped (raft drops a read index request without a leader, and a
	// candidate's), so issue them again now rather than an election timeout
	// later. An answer to the old round is ignored. (A retired round's
	// requests are in a later round already.)
	if rd.SoftState != nil && rd.SoftState.Lead != 0 && len(n.inflight) > 0 {
		for seq, r := range n.inflight {
			delete(n.inflight, seq)
			if !r.retired {
				n.pending = append(n.pending, keepReads(r.reqs)...)
			}
		}
		n.issueReads()
	}
}

// leadershipChanged reports the end of a leadership (also when several
// state changes happened between two Readys and the node is leader again in
// a newer term) and arms the LeaderReady check for a new one.
func (n *Node) leadershipChanged() {
	bs := n.rn.BasicStatus()
	leader, term := bs.RaftState == raft.StateLeader, bs.GetTerm()
	if !leader {
		// Refused (ErrNotLeader) by the loop's next flushProposals; also
		// when leadership was won and lost before a Ready set isLeader.
		n.releaseHeld()
	}
	if n.isLeader && (!leader || term != n.leaderTerm) {
		n.isLeader = false
		n.cfg.StateMachine.LeaderLost()
	}
	if leader && !n.isLeader {
		n.isLeader = true
		n.leaderTerm = term
		n.readyTerm = 0
	}
}

func (n *Node) apply(ents []*raftpb.Entry) {
	for _, e := range ents {
		if e.GetType() == raftpb.EntryConfChange {
			var cc raftpb.ConfChange
			if err := proto.Unmarshal(e.GetData(), &cc); err == nil {
				n.confState = n.rn.ApplyConfChange(&cc)
			}
		} else if e.GetType() == raftpb.EntryConfChangeV2 {
			var cc raftpb.ConfChangeV2
			if err := proto.Unmarshal(e.GetData(), &cc); err == nil {
				n.confState = n.rn.ApplyConfChange(&cc)
			}
		}
	}
	n.cfg.StateMachine.Apply(ents)
	for _, e := range ents {
		n.sinceSnap += len(e.GetData())
	}
	last := ents[len(ents)-1].GetIndex()
	if n.isLeader && n.readyTerm == 0 {
		for _, e := range ents {
			if e.GetTerm() == n.leaderTerm {
				n.readyTerm = n.leaderTerm
				n.cfg.StateMachine.LeaderReady(n.leaderTerm)
				break
			}
		}
	}
	n.setApplied(last)
	n.maybeSnapshot(last)
}

// setApplied records the applied index and wakes WaitApplied callers.
func (n *Node) setApplied(last uint64) {
	n.appliedMu.Lock()
	defer n.appliedMu.Unlock()
	n.applied = last
	kept := n.appliedW[:0]
	for _, w := range n.appliedW {
		if w.index <= last {
			close(w.c)
		} else {
			kept = append(kept, w)
		}
	}
	n.appliedW = kept
}

func (n *Node) publishStatus() {
	bs := n.rn.BasicStatus()
	n.appliedMu.Lock()
	applied := n.applied
	n.appliedMu.Unlock()
	st := &Status{
		ID:      n.cfg.ID,
		Leader:  bs.Lead,
		Term:    bs.GetTerm(),
		Commit:  bs.GetCommit(),
		Applied: applied,
		State:   bs.RaftState,

		LeadTransferee: bs.LeadTransferee,
	}
	old := n.status.Load()
	n.status.Store(st)
	if old == nil || old.Leader != st.Leader || old.Term != st.Term || old.LeadTransferee != st.LeadTransferee {
		next := make(chan struct{})
		prev := n.leaderC.Swap(&next)
		close(*prev)
	}
}
