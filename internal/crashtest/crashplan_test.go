package crashtest

import (
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"

	"github.com/quorumlock/quorumlock/raftnode"
)

// victim says which replicas a crash takes down.
type victim int

const (
	theLeader     victim = iota // the leader alone
	aFollower                   // one follower alone
	allAtLeader                 // every replica, at the leader's failpoint
	allAtFollower               // every replica, at a follower's failpoint
)

var victims = []victim{theLeader, aFollower, allAtLeader, allAtFollower}

func (v victim) String() string {
	return [...]string{"leader", "follower", "all-at-leader", "all-at-follower"}[v]
}

// all reports whether every replica crashes.
func (v victim) all() bool { return v == allAtLeader || v == allAtFollower }

// crashPlan is an armed crash: the first time target passes point in the
// role the plan asks for (and in a Ready where the point matters), the
// victims' links are cut, their file systems are crash-cloned, and the
// target's node goroutine waits at the point until the test has stopped the
// victims' services. The clones are what the victims restart from.
type crashPlan struct {
	c        *cluster
	point    string
	target   uint64
	role     raft.StateType // ignored when anyRole
	anyRole  bool
	victims  []uint64
	received *bool // snapshot points: only a snapshot received (true) or taken (false); nil: either

	// Owned by the target's node goroutine.
	tentative  map[uint64]*vfs.MemFS // clones taken at before-save
	frozen     []*freeze             // the other victims' state machines, since the clones
	sawEntries bool                  // the current Ready saved entries
	payloads   int                   // payloads applied before the current Ready's apply
	fired      bool

	crashc      chan crashEvent
	resume      chan struct{}
	releaseOnce sync.Once

	mu        sync.Mutex // orders a firing against abandon
	abandoned bool       // armAndAwait gave up on the plan: it must not fire
}

type crashEvent struct {
	point  string
	target uint64
	role   raft.StateType
	life   int
	clones map[uint64]*vfs.MemFS
}

func (p *crashPlan) release() { p.releaseOnce.Do(func() { close(p.resume) }) }

// arm plans a crash at point. The target, whose failpoint fires the crash,
// is the current leader for theLeader and allAtLeader, else the
// lowest-numbered follower.
func (c *cluster) arm(point string, v victim, received *bool) *crashPlan {
	c.t.Helper()
	lead := c.waitLeader()
	p := &crashPlan{
		c:        c,
		point:    point,
		target:   lead.rep.id,
		role:     raft.StateLeader,
		received: received,
		crashc:   make(chan crashEvent, 1),
		resume:   make(chan struct{}),
	}
	if v == aFollower || v == allAtFollower {
		p.role = raft.StateFollower
		for _, id := range c.ids {
			if id != p.target {
				p.target = id
				break
			}
		}
	}
	p.victims = []uint64{p.target}
	if v.all() {
		p.victims = slices.Clone(c.ids)
	}
	c.plan.Store(p)
	return p
}

// armReplica plans a crash of replica id (which may be down now and restart
// later) at point, whatever its role. (A replica that restarts may still
// publish itself as a pre-candidate when the leader's snapshot reaches it.)
func (c *cluster) armReplica(id uint64, point string, received *bool) *crashPlan {
	p := &crashPlan{
		c:        c,
		point:    point,
		target:   id,
		anyRole:  true,
		victims:  []uint64{id},
		received: received,
		crashc:   make(chan crashEvent, 1),
		resume:   make(chan struct{}),
	}
	c.plan.Store(p)
	return p
}

// failpoint is every life's Config.Failpoint.
func (c *cluster) failpoint(l *life, point string) {
	switch point {
	case raftnode.FailpointBeforeSave:
		l.inReady = true
	case raftnode.FailpointAfterApply:
		defer func() { l.inReady = false }()
	}
	p := c.plan.Load()
	if l.pending != nil {
		// Cut and cloned at before-save: it decides at after-save even if
		// it was disarmed since.
		p = l.pending
	}
	if p != nil && p.target == l.rep.id {
		p.at(l, point)
	}
}

// at runs on the target's node goroutine at every failpoint. A crash at
// before-save is only kept for a Ready that saves entries (the clones are
// taken at before-save, the decision made at after-save; the node did
// nothing visible in between); one at after-save or after-send only for a
// Ready that saved entries, and one at after-apply only for a Ready that
// applied a payload (a client request). (A leader passes after-send and
// after-apply before after-save; for it "a Ready that saved entries" is
// the one before, which under the workload almost always holds too.)
func (p *crashPlan) at(l *life, point string) {
	if p.fired {
		return
	}
	inRole := p.anyRole || l.node.Status().State == p.role
	switch point {
	case raftnode.FailpointBeforeSave:
		if p.point == point && inRole {
			p.tentative = p.cutAndClone()
			l.pending = p
		}
	case raftnode.FailpointAfterSave:
		p.sawEntries = l.store.lastSave.Load() > 0
		if clones := p.tentative; clones != nil {
			p.tentative = nil
			l.pending = nil
			if p.sawEntries {
				p.crash(l, clones)
				return
			}
			p.c.nw.setCut(p.victims, false)
			p.thaw(false)
		}
		if p.point == point && p.sawEntries && inRole {
			p.crash(l, p.cutAndClone())
		}
	case raftnode.FailpointAfterSend:
		p.payloads = l.sm.payloadsApplied()
		if p.point == point && p.sawEntries && inRole {
			p.crash(l, p.cutAndClone())
		}
	case raftnode.FailpointAfterApply:
		if p.point == point && l.sm.payloadsApplied() > p.payloads && inRole {
			p.crash(l, p.cutAndClone())
		}
	case raftnode.FailpointBeforeSnapshotSave, raftnode.FailpointAfterSnapshotSave:
		if p.point == point && inRole && (p.received == nil || *p.received == l.inReady) {
			p.crash(l, p.cutAndClone())
		}
	}
}

// cutAndClone cuts the victims off (so that nothing they do from now on
// reaches anyone), freezes the state machines of the victims other than
// the target (so that none of them applies, and answers a client, what it
// commits after the crash instant: a leader's own Save in flight at the
// clone may still return, and with the followers' acknowledgements that
// arrived before, commit an entry its clone does not hold), and then takes
// a crash clone of each one's file system: what it had synced at this
// instant.
func (p *crashPlan) cutAndClone() map[uint64]*vfs.MemFS {
	p.c.nw.setCut(p.victims, true)
	clones := make(map[uint64]*vfs.MemFS)
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	for _, id := range p.victims {
		if cur := p.c.reps[id].cur; id != p.target && cur != nil {
			f := &freeze{done: make(chan struct{})}
			cur.sm.freeze.Store(f)
			p.frozen = append(p.frozen, f)
		}
	}
	for _, id := range p.victims {
		clones[id] = p.c.reps[id].fs.CrashClone(vfs.CrashCloneCfg{})
	}
	return clones
}

// thaw ends the freeze of the other victims: dead (they crashed at the
// clone instant) makes their state machines drop every later entry.
func (p *crashPlan) thaw(dead bool) {
	for _, f := range p.frozen {
		f.dead = dead
		close(f.done)
	}
	p.frozen = nil
}

func (p *crashPlan) crash(l *life, clones map[uint64]*vfs.MemFS) {
	p.mu.Lock()
	if p.abandoned {
		// Nobody waits for it any more: undo the cut and the freeze, and
		// go on as if never armed.
		p.mu.Unlock()
		p.c.nw.setCut(p.victims, false)
		p.thaw(false)
		return
	}
	p.thaw(true)
	// The target is down from this instant too: once released it goes on
	// until it is stopped, and a leader's own Save of entries the followers
	// acknowledged before the cut could then commit and apply entries its
	// crash image does not hold.
	dead := &freeze{done: make(chan struct{}), dead: true}
	close(dead.done)
	l.sm.freeze.Store(dead)
	p.fired = true
	p.crashc <- crashEvent{point: p.point, target: p.target, role: p.role, life: l.n, clones: clones}
	p.mu.Unlock()
	<-p.resume
}

// abandon makes p never fire from now on. It returns the event of a firing
// that came first, if any.
func (p *crashPlan) abandon() (crashEvent, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.abandoned = true
	select {
	case ev := <-p.crashc:
		return ev, true
	default:
		return crashEvent{}, false
	}
}

// awaitCrash waits for the armed plan to fire, stops the victims and
// installs their crash images. It returns the event and each victim's
// store state at the moment it stopped.
func (c *cluster) awaitCrash(p *crashPlan) (crashEvent, map[uint64]string) {
	c.t.Helper()
	var ev crashEvent
	select {
	case ev = <-p.crashc:
	case <-time.After(waitTimeout):
		c.plan.CompareAndSwap(p, nil)
		c.t.Fatalf("replica %d never reached %s as %v within %v", p.target, p.point, p.role, waitTimeout)
	}
	return ev, c.crashed(p, ev)
}

// armAndAwait arms a plan on the current roles (arm) and waits for it to
// fire, as awaitCrash does. A plan whose target left its role before the
// point (an election under the load of -race on two cores) never fires: it
// is disarmed after waitTimeout and armed again on the roles of then, up
// to three attempts.
func (c *cluster) armAndAwait(point string, v victim, received *bool) (*crashPlan, crashEvent, map[uint64]string) {
	c.t.Helper()
	for attempt := 1; ; attempt++ {
		p := c.arm(point, v, received)
		select {
		case ev := <-p.crashc:
			return p, ev, c.crashed(p, ev)
		case <-time.After(waitTimeout):
		}
		c.plan.CompareAndSwap(p, nil)
		// A node goroutine that loaded the plan before it was disarmed (or
		// cut and cloned at before-save) may still fire it; after a grace
		// period the plan is abandoned, so that it never fires after this
		// test stopped waiting for it.
		select {
		case ev := <-p.crashc:
			return p, ev, c.crashed(p, ev)
		case <-time.After(time.Second):
		}
		if ev, fired := p.abandon(); fired {
			return p, ev, c.crashed(p, ev)
		}
		if attempt == 3 {
			c.t.Fatalf("replica %d never reached %s as %v within %v, in %d attempts", p.target, p.point, p.role, waitTimeout, attempt)
		}
		c.t.Logf("replica %d did not reach %s as %v within %v; arming again", p.target, p.point, p.role, waitTimeout)
	}
}

// crashed finishes a fired plan: it stops the victims and installs their
// crash images, and returns each victim's store state when it stopped.
func (c *cluster) crashed(p *crashPlan, ev crashEvent) map[uint64]string {
	c.plan.CompareAndSwap(p, nil)
	states := c.stop(p.victims, p.release)
	c.mu.Lock()
	for id, fs := range ev.clones {
		c.reps[id].fs = fs
	}
	c.mu.Unlock()
	return states
}

// restart starts a new life of each of ids from its file system.
func (c *cluster) restart(ids []uint64) map[uint64]string {
	c.t.Helper()
	states := make(map[uint64]string)
	for _, id := range ids {
		c.start(c.reps[id])
		states[id] = describe(c.reps[id].cur.store)
	}
	return states
}

// crashNow takes down replica id at an arbitrary moment of its run: a crash
// image of its file system as it is now.
func (c *cluster) crashNow(id uint64) {
	c.nw.setCut([]uint64{id}, true)
	c.mu.Lock()
	clone := c.reps[id].fs.CrashClone(vfs.CrashCloneCfg{})
	c.mu.Unlock()
	c.stop([]uint64{id}, nil)
	c.mu.Lock()
	c.reps[id].fs = clone
	c.mu.Unlock()
}
