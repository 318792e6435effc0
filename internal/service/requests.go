package service

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/quorumlock/quorumlock/internal/fsm"
	"github.com/quorumlock/quorumlock/internal/lockpb"
	"github.com/quorumlock/quorumlock/raftnode"
)

// Propose serves every session command (open, acquire, release, withdraw,
// close). It answers NOT_LEADER (with a hint) unless this replica is the
// leader; a leader not ready yet holds the request until it is (up to
// Config.ReadyWait, then UNAVAILABLE). An acquire that queues waits, unless NoWait is
// set, until it is granted, its session ends, leadership is lost or ctx ends
// (ctx's error is returned; the request stays queued and a retry with the
// same (session, seq) finds it). A copy of a request (session, seq) of
// which MaxCopiesInFlight copies wait already is answered UNAVAILABLE. It
// is also the gRPC handler.
func (s *Service) Propose(ctx context.Context, req *lockpb.Request) (resp *lockpb.Response, err error) {
	if h := s.cfg.Hooks.Request; h != nil {
		start := time.Now()
		defer func() { h(req.GetOp(), resp, err, time.Since(start)) }()
	}
	return s.propose(ctx, req)
}

func (s *Service) propose(ctx context.Context, req *lockpb.Request) (*lockpb.Response, error) {
	if code, hint := s.awaitReady(ctx); code != lockpb.Code_CODE_OK {
		return &lockpb.Response{Code: code, LeaderHint: hint, LeaderAddr: s.cfg.Peers[hint]}, nil
	}
	cmd, waitGrant, invalid := Command(req)
	if invalid != nil {
		return invalid, nil
	}
	var key reqKey
	switch cmd.Op {
	case fsm.OpOpenSession:
		// Every replica applies it under this leader's limits (see
		// fsm.Command.Limits).
		cmd.Limits.MaxSessions = uint64(s.lim.MaxSessions)
	case fsm.OpAcquire:
		cmd.Limits = fsm.Stamped{
			MaxNameBytes:       uint64(s.lim.MaxNameBytes),
			MaxLocksPerSession: uint64(s.lim.MaxLocksPerSession),
			MaxWaitersPerLock:  uint64(s.lim.MaxWaitersPerLock),
		}
	case fsm.OpRevoke:
		if _, live := s.SessionTTL(cmd.IDs[0]); !live {
			// Only a confirmed leader may answer that a session is gone:
			// one deposed without knowing it yet lacks the sessions its
			// successor opened.
			if err := s.linearize(ctx); err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				return s.notLeader(), nil
			}
			if _, live := s.SessionTTL(cmd.IDs[0]); !live {
				return &lockpb.Response{Code: lockpb.Code_CODE_NO_SESSION}, nil
			}
		}
	}
	// A withdrawal without a name takes back its target request only.
	targetOnly := cmd.Op == fsm.OpWithdraw && cmd.Name == "" && cmd.Target != 0
	if (cmd.Op == fsm.OpAcquire || cmd.Op == fsm.OpRelease || cmd.Op == fsm.OpWithdraw || cmd.Op == fsm.OpProclaim) && !targetOnly {
		if !fsm.ValidKey(cmd.Name, s.lim.MaxNameBytes) && !s.inTable(cmd.Name) {
			return &lockpb.Response{Code: lockpb.Code_CODE_INVALID, Message: s.nameRule()}, nil
		}
		if len(cmd.Value) > s.lim.MaxValueBytes {
			return &lockpb.Response{Code: lockpb.Code_CODE_INVALID, Message: "value too large"}, nil
		}
	}

	if cmd.Op == fsm.OpOpenSession && cmd.OpenID != 0 {
		if resp, done, err := s.reopen(ctx, &cmd); done {
			return resp, err
		}
	}

	reqc := make(chan outcome, 1)
	var grantc chan outcome
	s.mu.Lock()
	joined := false // waits for the entry of an earlier attempt
	switch cmd.Op {
	case fsm.OpOpenSession:
		if f, ok := s.openInFlight[cmd.OpenID]; ok && cmd.OpenID != 0 && f.ttl == cmd.TTL {
			// A retry of an open whose entry this leadership proposed and
			// has not applied (the earlier attempt timed out under load):
			// it waits for that entry's answer instead of logging another
			// (see openInFlight).
			key, joined = f.key, true
			delete(s.abandonedOpens, f.key.seq) // a caller waits for it again
			break
		}
		cmd.Nonce = s.rnd.Uint64()
		key = reqKey{0, cmd.Nonce}
		if _, busy := s.openInFlight[cmd.OpenID]; cmd.OpenID != 0 && !busy {
			s.openInFlight[cmd.OpenID] = inFlightOpen{key, cmd.TTL}
		}
	case fsm.OpRevoke:
		// Answered when the session ends (EventSessionEnded) or, if it is
		// already gone, by the revoke's own apply.
		cmd.Nonce = s.rnd.Uint64()
		key = reqKey{0, cmd.Nonce}
	default:
		key = reqKey{cmd.Session, cmd.Seq}
	}
	copies := len(s.requests[key])
	if waitGrant {
		// A copy answered queued waits on for the grant, out of
		// s.requests.
		copies = s.waitCopies[key]
	}
	if copies >= MaxCopiesInFlight {
		// Not CODE_LIMIT: the copies in flight may still take effect (a
		// waiting acquire queues, then is granted), and a refusal tells
		// the client that nothing changed. (An open's copies join one
		// entry: never more than one open ID's callers.)
		s.mu.Unlock()
		return &lockpb.Response{Code: lockpb.Code_CODE_UNAVAILABLE, Message: fmt.Sprintf("%d copies of this request in flight: retry", MaxCopiesInFlight)}, nil
	}
	s.requests[key] = append(s.requests[key], reqc)
	// An acquire that will wait behind another session's hold can only be
	// granted by an entry proposed later (a release, an expiry): raft may
	// hold it until then and send it with that entry, in one append and one
	// fsync per follower (raftnode.Node.ProposeDeferred). The log order is
	// unchanged. Apply releases it early if the lock frees meanwhile.
	//
	// The epoch is read under s.mu, as Apply calls ReleaseDeferred: an
	// apply that frees the lock after this decision but before the
	// proposal reaches raft's loop has changed it, and raft does not hold
	// the proposal.
	deferred := false
	var epoch uint64
	if waitGrant {
		s.waitCopies[key]++
		if h := s.m.HolderID(cmd.Name); h != 0 && h != cmd.Session {
			deferred = true
			epoch = s.raft.DeferEpoch()
			s.deferred[key] = deferredAcquire{session: cmd.Session, name: cmd.Name}
		}
		grantc = make(chan outcome, 1)
		byName := s.grants[cmd.Session]
		if byName == nil {
			byName = make(map[string][]chan outcome)
			s.grants[cmd.Session] = byName
		}
		byName[cmd.Name] = append(byName[cmd.Name], grantc)
		s.grantOf[reqc] = grantc
	}
	s.mu.Unlock()
	defer s.unregister(key, reqc, cmd.Session, cmd.Name, grantc)

	// The answer comes on reqc: the entry's apply, leadership lost, or
	// raft's refusal (refuse). An entry the node never took because it
	// stopped is answered through Done.
	var err error
	if !joined {
		err = s.raft.ProposeAsync(ctx, raftnode.AsyncProposal{
			Data:     fsm.Encode(&cmd),
			Deferred: deferred,
			Epoch:    epoch,
			Refused:  func(error) { s.refuse(key, reqc, cmd.OpenID) },
		})
	}
	if err != nil {
		if cmd.Op == fsm.OpOpenSession {
			s.notProposed(key, reqc, cmd.OpenID)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return s.redirect(ctx), nil
	}
	var o outcome
	select {
	case o = <-reqc:
	case <-ctx.Done():
		if cmd.Op == fsm.OpOpenSession {
			s.abandonOpen(key, reqc, cmd.OpenID)
		}
		return nil, ctx.Err()
	case <-s.raft.Done():
		return s.notLeader(), nil
	}
	if o.notLeader {
		return s.redirect(ctx), nil
	}
	if o.expiring {
		return reopenExpiring(), nil
	}
	if o.res.Code == fsm.CodeQueued && waitGrant {
		select {
		case o = <-grantc:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if o.notLeader {
			return s.redirect(ctx), nil
		}
	}
	return ResponseOf(o.res), nil
}

// reopen answers a retry of an open whose session is live in the table
// (an earlier attempt's entry applied; its answer was lost or came after
// the client gave up) without logging another entry, which would only
// return that session: under overload most attempts were such retries,
// each adding an entry to the backlog that made them time out. It is a
// heartbeat of the session: its timer restarts on receipt (the client's
// lease counts from before its first attempt, invariant 5), and the answer
// waits for a leadership confirmation issued after receipt and the apply
// of everything before it, after which the session must still be live and
// not expiring (invariants 3 and 4; see Heartbeat). A session being
// expired is answered UNAVAILABLE: the client retries, and opens anew
// once the Expire applied. done is false when cmd is not such a retry (no
// live session of its open ID, or one with another TTL, which the log
// answers CodeInvalid): it goes through the log.
func (s *Service) reopen(ctx context.Context, cmd *fsm.Command) (resp *lockpb.Response, done bool, err error) {
	s.mu.Lock()
	si, live := s.m.OpenedBy(cmd.OpenID)
	if !live || si.TTL != cmd.TTL || !s.ready {
		s.mu.Unlock()
		return nil, false, nil
	}
	if s.expiring[si.ID] {
		s.mu.Unlock()
		return reopenExpiring(), true, nil
	}
	term := s.term
	s.touch(si.ID, time.Duration(si.TTL), s.clk.Now())
	s.mu.Unlock()
	if err := s.linearize(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, true, ctx.Err()
		}
		return s.notLeader(), true, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ready || s.term != term {
		return s.notLeader(), true, nil
	}
	if _, ok := s.m.Session(si.ID); !ok || s.expiring[si.ID] {
		return reopenExpiring(), true, nil
	}
	return ResponseOf(fsm.Result{Code: fsm.CodeOK, Session: si.ID}), true, nil
}

// reopenExpiring answers a retried open whose session is being expired
// (or ended since): the client retries, and then opens a new session.
func reopenExpiring() *lockpb.Response {
	return &lockpb.Response{Code: lockpb.Code_CODE_UNAVAILABLE, Message: "the session of this open is expiring: retry"}
}

// MaxCopiesInFlight bounds the copies of one request (session, seq)
// waiting for their answer at once: a client re-sends a request only
// after it gave up on the copy before (a timeout, a leader change), so it
// has one or two in flight. Each copy costs the leader a log entry, a
// waiter and, on a stream, a goroutine: without a bound, one client could
// send 50,000 copies of a waiting acquire on one stream and cost the
// leader 50,000 goroutines and entries (found by review N). A copy past
// it is answered CODE_UNAVAILABLE (retry) and proposes nothing. Not
// CODE_LIMIT, which the client reports as ErrLimit, "nothing changed":
// the copies waiting may still take effect. A legitimate client reaches
// the bound only when copies it gave up on still wait here (sent on
// connections that died without the leader noticing); they leave when the
// request is answered, and the client's retry then gets that answer
// (review Q: before, such an Acquire failed with ErrLimit while its
// session stayed queued, and was granted the lock unknowingly).
const MaxCopiesInFlight = 64

// MaxListed bounds the requests in flight a request may list
// (lockpb.Request.pending). It is the fsm's bound on a session's
// remembered outcomes (MaxPendingPerSession, 1,024), which a session with
// more applied requests in flight reaches anyway: below it, every request
// can list the others, so a few long waits never pin the outcomes of the
// requests after them. (At 32, a session with 33 waiting acquires sent
// its other requests with done alone, and after 1,024 of them every
// request failed with ErrLimit.)
const MaxListed = 1_024

// Command maps a request to the fsm command it proposes, before the
// leader's part of it: the limits the leader stamps (fsm.Command.Limits),
// an open's or a revoke's nonce, a revoke's check that its session is live,
// and the name and value rules. An open's ttl_ms outside what a
// time.Duration holds becomes a TTL of -1, which Apply refuses. waitGrant
// reports a blocking acquire (neither Try nor NoWait), which waits on for
// its grant when queued. invalid, if not nil, is the answer to a request
// that is refused as it stands: an unknown op, or a pending list (Listed)
// longer than MaxListed, not increasing, or not below the request's seq.
func Command(req *lockpb.Request) (cmd fsm.Command, waitGrant bool, invalid *lockpb.Response) {
	cmd = fsm.Command{
		Session: req.GetSession(),
		Seq:     req.GetSeq(),
		Done:    req.GetDone(),
		Name:    req.GetName(),
		Try:     req.GetTry(),
		Token:   req.GetToken(),
		Target:  req.GetTarget(),
		Value:   req.GetValue(),
	}
	switch req.GetOp() {
	case lockpb.Op_OP_OPEN_SESSION:
		cmd.Op = fsm.OpOpenSession
		// Bound ttl_ms before scaling it: a product that overflows could
		// wrap into [MinTTL, MaxTTL].
		cmd.TTL = -1
		if ms := req.GetTtlMs(); ms > 0 && ms <= math.MaxInt64/int64(time.Millisecond) {
			cmd.TTL = int64(time.Duration(ms) * time.Millisecond)
		}
		cmd.OpenID = req.GetOpenId()
	case lockpb.Op_OP_ACQUIRE:
		cmd.Op = fsm.OpAcquire
		waitGrant = !req.GetTry() && !req.GetNoWait()
	case lockpb.Op_OP_RELEASE:
		cmd.Op = fsm.OpRelease
	case lockpb.Op_OP_WITHDRAW:
		cmd.Op = fsm.OpWithdraw
	case lockpb.Op_OP_CLOSE_SESSION:
		cmd.Op = fsm.OpCloseSession
	case lockpb.Op_OP_PROCLAIM:
		cmd.Op = fsm.OpProclaim
	case lockpb.Op_OP_REVOKE:
		return fsm.Command{Op: fsm.OpRevoke, IDs: []uint64{req.GetSession()}}, false, nil
	default:
		return cmd, false, &lockpb.Response{Code: lockpb.Code_CODE_INVALID, Message: "unknown op"}
	}
	if req.GetListed() && cmd.Op != fsm.OpOpenSession {
		// The session's other requests in flight: every other seq below
		// this one is retired (fsm.Command.Listed).
		p := req.GetPending()
		if len(p) > MaxListed || !strictlyBelow(p, cmd.Seq) {
			return cmd, false, &lockpb.Response{Code: lockpb.Code_CODE_INVALID, Message: fmt.Sprintf("pending: more than %d, not increasing, or not below seq", MaxListed)}
		}
		cmd.Listed, cmd.Pending = true, p
	}
	return cmd, waitGrant, nil
}

// strictlyBelow reports whether p increases strictly and stays below seq.
func strictlyBelow(p []uint64, seq uint64) bool {
	for i, x := range p {
		if x >= seq || (i > 0 && x <= p[i-1]) {
			return false
		}
	}
	return true
}

// refuse answers reqc NOT_LEADER, if it still waits for the request key:
// raft refused the request's entry (not the leader, a leadership transfer
// under way, too much uncommitted), and so are the other waiters of an
// open's entry (of open ID openID). It runs on raft's goroutine.
func (s *Service) refuse(key reqKey, reqc chan outcome, openID uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dropRequest(key, reqc) {
		reqc <- outcome{notLeader: true}
	} // else answered already (an earlier copy of the request applied)
	if key.session == 0 {
		// An open's or revoke's entry, never in the log: the retries of
		// the open that joined it are answered too.
		s.dropNonce(key, openID)
	}
}

// notProposed is refuse for an open of openID whose entry raft never took
// (its proposer's ctx ended first, or the node stopped): reqc, the
// proposer's waiter, is answered by the proposer itself.
func (s *Service) notProposed(key reqKey, reqc chan outcome, openID uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropRequest(key, reqc)
	s.dropNonce(key, openID)
}

// dropNonce forgets the open (of openID) or revoke entry key (session 0),
// which is not in the log: its waiters are answered NOT_LEADER, so that
// they send their request again. s.mu is held.
func (s *Service) dropNonce(key reqKey, openID uint64) {
	for _, c := range s.requests[key] {
		c <- outcome{notLeader: true}
	}
	delete(s.requests, key)
	delete(s.abandonedOpens, key.seq)
	if s.openInFlight[openID].key == key {
		delete(s.openInFlight, openID)
	}
}

// dropRequest removes the waiter reqc of the request key and reports
// whether it was still registered. s.mu must be held.
func (s *Service) dropRequest(key reqKey, reqc chan outcome) bool {
	cs := s.requests[key]
	if !slices.Contains(cs, reqc) {
		return false
	}
	s.requests[key] = slicesDelete(cs, reqc)
	if len(s.requests[key]) == 0 {
		delete(s.requests, key)
		delete(s.deferred, key)
	}
	return true
}

// unregister drops waiters that were not answered.
func (s *Service) unregister(key reqKey, reqc chan outcome, session uint64, name string, grantc chan outcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.grantOf, reqc)
	delete(s.armed, grantc)
	s.dropRequest(key, reqc)
	if grantc != nil {
		if s.waitCopies[key]--; s.waitCopies[key] <= 0 {
			delete(s.waitCopies, key)
		}
		if byName := s.grants[session]; byName != nil {
			byName[name] = slicesDelete(byName[name], grantc)
			if len(byName[name]) == 0 {
				delete(byName, name)
			}
			if len(byName) == 0 {
				delete(s.grants, session)
			}
		}
	}
}

func slicesDelete(cs []chan outcome, c chan outcome) []chan outcome {
	for i, x := range cs {
		if x == c {
			return append(cs[:i], cs[i+1:]...)
		}
	}
	return cs
}

func (s *Service) notLeader() *lockpb.Response {
	hint := otherLeader(s.raft.Status())
	return &lockpb.Response{Code: lockpb.Code_CODE_NOT_LEADER, LeaderHint: hint, LeaderAddr: s.cfg.Peers[hint]}
}

// redirect is notLeader for a request this replica took as leader and
// could not serve: raft refused the proposal (a leadership transfer is
// under way) or the leadership ended before the answer. While the replica
// runs and names no other leader (a transfer under way, no leader known
// yet, or a leadership lost but not yet published: raftnode calls
// LeaderLost before it publishes the Status), it waits up to LeaderWait,
// or until ctx ends, for one to become known, so that the caller is sent
// straight to the new leader; the other replicas may still name this one
// for a round trip. A leader that is ready and transfers nothing (raft
// dropped the proposal for another reason, or abandoned the transfer,
// which LeaderChanged signals) answers at once, as before.
func (s *Service) redirect(ctx context.Context) *lockpb.Response {
	timer := time.NewTimer(s.cfg.LeaderWait)
	defer timer.Stop()
	for {
		changed := s.raft.LeaderChanged()
		s.mu.Lock()
		ready, readyChanged := s.ready, s.readyC
		s.mu.Unlock()
		st := s.raft.Status()
		if st.Leader != 0 && (st.Leader != st.ID || (st.LeadTransferee == 0 && ready)) {
			// Another leader, or this one, ready, without a transfer.
			return s.notLeader()
		}
		select {
		case <-changed:
		case <-readyChanged:
		case <-ctx.Done():
			return s.notLeader()
		case <-timer.C:
			return s.notLeader()
		case <-s.stopc:
			return s.notLeader()
		case <-s.raft.Done():
			return s.notLeader()
		}
	}
}

// otherLeader is the leader st names as a hint for a caller sent away: 0
// where it names this replica, which the caller is already asking.
func otherLeader(st raftnode.Status) uint64 {
	if st.Leader == st.ID {
		return 0
	}
	return st.Leader
}

// ResponseOf is the answer to a request whose command had result r.
func ResponseOf(r fsm.Result) *lockpb.Response {
	resp := &lockpb.Response{Token: r.Token, Session: r.Session}
	switch r.Code {
	case fsm.CodeOK:
		resp.Code = lockpb.Code_CODE_OK
	case fsm.CodeQueued:
		resp.Code, resp.Queued = lockpb.Code_CODE_OK, true
	case fsm.CodeLocked:
		resp.Code = lockpb.Code_CODE_LOCKED
	case fsm.CodeNotHeld:
		resp.Code = lockpb.Code_CODE_NOT_HELD
	case fsm.CodeNoSession:
		resp.Code = lockpb.Code_CODE_NO_SESSION
	case fsm.CodeLimit:
		resp.Code = lockpb.Code_CODE_LIMIT
	case fsm.CodeWithdrawn:
		resp.Code = lockpb.Code_CODE_WITHDRAWN
	default:
		resp.Code = lockpb.Code_CODE_INVALID
	}
	return resp
}

// Holder is a linearizable read of one lock (DESIGN.md invariant 9): a
// ReadIndex confirmed by the leader, then a wait until this replica has
// applied that index. It works on every replica; one cut off from the
// majority blocks until ctx ends.
func (s *Service) Holder(ctx context.Context, req *lockpb.HolderRequest) (*lockpb.HolderResponse, error) {
	if !fsm.ValidKey(req.GetName(), fsm.MaxNameBytesLimit) {
		return &lockpb.HolderResponse{Code: lockpb.Code_CODE_INVALID, Message: s.nameRule()}, nil
	}
	if err := s.linearize(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	li := s.m.Holder(req.GetName())
	s.mu.Unlock()
	if li.Holder == 0 && !fsm.ValidKey(req.GetName(), s.lim.MaxNameBytes) {
		// See Readable.
		return &lockpb.HolderResponse{Code: lockpb.Code_CODE_INVALID, Message: s.nameRule()}, nil
	}
	return holderResponse(li), nil
}

// Readable reports whether key may be read (Holder, Watch): a valid name
// within MaxNameBytes, or one longer (up to fsm.MaxNameBytesLimit) that
// the table holds, as of a linearizable read. A lock or role granted
// under a larger MaxNameBytes, before a rolling change lowered it, can so
// still be read and its holder found; another name over the limit is
// refused as before. Its error is the linearizable read's (ctx's).
func (s *Service) Readable(ctx context.Context, key string) (bool, error) {
	switch {
	case fsm.ValidKey(key, s.lim.MaxNameBytes):
		return true, nil
	case !fsm.ValidKey(key, fsm.MaxNameBytesLimit):
		return false, nil
	}
	if err := s.linearize(ctx); err != nil {
		return false, err
	}
	return s.inTable(key), nil
}

func holderResponse(li fsm.LockInfo) *lockpb.HolderResponse {
	return &lockpb.HolderResponse{Session: li.Holder, Token: li.Token, Waiters: li.Waiters, Value: li.Value}
}

// inTable reports whether the lock table has a lock (or role) called key.
// A request naming one that is longer than MaxNameBytes is still
// proposed: an earlier leader granted it under a larger MaxNameBytes (a
// rolling change lowered the limit), and refused here, a release,
// withdrawal or proclaim would leave it with a live session that cannot
// let go of it, and a copy of an acquire that an earlier leader queued
// would be answered as if nothing had changed. The table answers a copy
// with its outcome and refuses a new acquire (CodeInvalid).
func (s *Service) inTable(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m.HolderID(key) != 0
}

// nameRule is the message of a CODE_INVALID answer to a name outside the
// cluster's bound (a client states it in its ErrInvalidName).
func (s *Service) nameRule() string {
	return fmt.Sprintf("want 1..%d bytes of UTF-8 without NUL", s.lim.MaxNameBytes)
}

func (s *Service) linearize(ctx context.Context) error {
	idx, err := s.raft.ReadIndex(ctx)
	if err != nil {
		return err
	}
	return s.raft.WaitApplied(ctx, idx)
}

// Heartbeat renews the sessions ids on the leader. The timers are reset on
// receipt; the answer waits for a leadership confirmation (ReadIndex) issued
// after receipt and for the apply of everything before it, so a deposed
// leader can never extend a client's belief (DESIGN.md invariant 4). A
// session the table does not hold, or whose expiry is under way, is
// reported gone rather than alive, also only after that confirmation: a
// leader deposed without knowing it yet lacks the sessions its successor
// opened and holds expiry marks that will never commit, and a "gone" ends
// the client's session. Concurrent heartbeats share confirmation rounds.
func (s *Service) Heartbeat(ctx context.Context, ids []uint64) (alive, gone []uint64, code lockpb.Code, hint uint64) {
	if code, hint := s.readyCode(); code != lockpb.Code_CODE_OK {
		return nil, nil, code, hint
	}
	s.mu.Lock()
	if !s.ready {
		s.mu.Unlock()
		r := s.notLeader()
		return nil, nil, r.Code, r.LeaderHint
	}
	// Read under s.mu, as every receipt time is, so that receipt times
	// reach the timer queue in order (timerQueue).
	now := s.clk.Now()
	term := s.term
	touched := make([]bool, len(ids))
	for i, id := range ids {
		if si, ok := s.m.Session(id); ok && !s.expiring[id] {
			s.touch(id, time.Duration(si.TTL), now)
			touched[i] = true
		}
	}
	s.mu.Unlock()
	if err := s.linearize(ctx); err != nil {
		r := s.notLeader()
		return nil, nil, r.Code, r.LeaderHint
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ready || s.term != term {
		r := s.notLeader()
		return nil, nil, r.Code, r.LeaderHint
	}
	for i, id := range ids {
		if _, ok := s.m.Session(id); !ok || s.expiring[id] {
			gone = append(gone, id)
		} else if touched[i] {
			alive = append(alive, id)
		} // else applied meanwhile, not renewed: the client retries it
	}
	if h := s.cfg.Hooks.Heartbeats; h != nil {
		h(len(alive), len(gone))
	}
	return alive, gone, lockpb.Code_CODE_OK, 0
}

// maxHeartbeatsInFlight bounds the batches of one KeepAlive stream being
// answered at once (see KeepAlive). A client sends a batch per 10,000
// sessions about every TTL/3, so this is far above what one needs.
const maxHeartbeatsInFlight = 1024

// KeepAlive is the gRPC stream form of Heartbeat: each request is one batch
// of sessions; answers may come back out of order, matched by batch number.
// At most maxHeartbeatsInFlight batches are answered at once, each until
// its answer is queued for sending: the next batch is read only when one
// is done, so a client that sends faster than the leader confirms, or
// reads no answers, is held back by flow control instead of costing the
// leader a goroutine per batch without bound.
func (s *Service) KeepAlive(stream lockpb.Lock_KeepAliveServer) error {
	ctx := stream.Context()
	out := make(chan *lockpb.KeepAliveResponse, 16)
	errc := make(chan error, 1)
	slots := make(chan struct{}, maxHeartbeatsInFlight)
	go func() {
		for {
			select {
			case r := <-out:
				if err := stream.Send(r); err != nil {
					errc <- err
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case slots <- struct{}{}:
		case err := <-errc:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		go func() {
			defer func() { <-slots }()
			alive, gone, code, hint := s.Heartbeat(ctx, req.GetSessions())
			select {
			case out <- &lockpb.KeepAliveResponse{Batch: req.GetBatch(), Code: code, LeaderHint: hint, LeaderAddr: s.cfg.Peers[hint], Alive: alive, Expired: gone}:
			case <-ctx.Done():
			}
		}()
		select {
		case err := <-errc:
			return err
		default:
		}
	}
}

// Status reports this replica's raft state.
func (s *Service) Status(ctx context.Context, _ *lockpb.StatusRequest) (*lockpb.StatusResponse, error) {
	st := s.raft.Status()
	return &lockpb.StatusResponse{Id: st.ID, Leader: st.Leader, Term: st.Term, Commit: st.Commit, Applied: st.Applied}, nil
}

// SessionTTL returns the TTL of a live session known to this replica's table.
func (s *Service) SessionTTL(id uint64) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	si, ok := s.m.Session(id)
	return time.Duration(si.TTL), ok
}
