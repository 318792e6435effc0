package harness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quorumlock/quorumlock/verify/history"
)

// Fault kinds the nemesis injects.
const (
	// IsolateLeader cuts the leader off from every other replica, both
	// ways; the minority side keeps the old leader until it steps down.
	IsolateLeader = "isolate-leader"
	// OneWayCut loses one direction of some links: the leader's outbound
	// links, or random ones.
	OneWayCut = "one-way-cut"
	// Partition splits the replicas (and the remote clients) into two
	// random groups.
	Partition = "partition"
	// DelayDrop delays and drops messages on random links.
	DelayDrop = "delay-drop"
	// KillMinority stops a random minority of the replicas (the leader
	// half of the time) in process, then restarts them on their data.
	KillMinority = "kill-minority"
	// RestartAll stops every replica and restarts them all.
	RestartAll = "restart-all"
	// LeaderChurn isolates the current leader briefly every TTL/2, forcing
	// an election each time.
	LeaderChurn = "leader-churn"
	// LeaderHandoff shuts the current leader down gracefully (Node.Close:
	// it hands leadership to a follower first) every TTL/2, and restarts
	// it after an election timeout.
	LeaderHandoff = "leader-handoff"
	// ClientCrash closes a remote client with its sessions (no close is
	// sent: they expire) and dials a new one.
	ClientCrash = "client-crash"
	// LeaderTransfer moves leadership from the current leader to a random
	// follower with raft's leadership transfer (MsgTimeoutNow), the old
	// leader staying up, every TTL/2.
	LeaderTransfer = "leader-transfer"
	// PauseLeader freezes the leader's process (SIGSTOP, emulated in
	// process: see Cluster.Pause) for longer than the TTL, then resumes
	// it (SIGCONT): it wakes still believing it leads, with its session
	// timers late.
	PauseLeader = "pause-leader"
	// PauseHolder freezes the process hosting a current lock holder (a
	// remote client or a replica) for longer than the TTL, then resumes
	// it: its fenced writes come after its lease.
	PauseHolder = "pause-holder"
	// Bridge splits the replicas into two sides with one replica, the
	// bridge, linked to both (Jepsen's bridge): each side is a minority
	// without it, and the bridge may lead or vote for either.
	Bridge = "bridge"
	// LeaderDeaf cuts the links into the leader, one way: it goes on
	// sending (appends, heartbeats) but hears nothing back, from the
	// other replicas and, half of the time, from the remote clients.
	LeaderDeaf = "leader-deaf"
	// ClientOneWay cuts one direction of each remote client's links to
	// the leader (or to every replica): a client that can send but not
	// hear, or hear but not send.
	ClientOneWay = "client-one-way"
)

// ExtraFaultKinds are fault kinds a trial draws only when named in
// Options.Faults (verify -faults): left out of FaultKinds so that a seed
// keeps replaying the plan it drew before they were added.
var ExtraFaultKinds = []string{Bridge, LeaderDeaf, ClientOneWay}

// FaultKinds lists the fault kinds a trial draws from by default (every
// kind but ExtraFaultKinds).
var FaultKinds = []string{IsolateLeader, OneWayCut, Partition, DelayDrop, KillMinority, RestartAll, LeaderChurn, LeaderHandoff, ClientCrash, LeaderTransfer, PauseLeader, PauseHolder}

// Step is one planned fault: its kind, how long it is held, the healthy
// pause after it, and the seed of its random choices (which replicas,
// which links). A plan is a function of the trial's seed alone; targets
// named by role ("the leader") are resolved when the step runs.
type Step struct {
	Kind  string
	Hold  time.Duration
	Pause time.Duration
	Rand  uint64
}

func (s Step) String() string {
	return fmt.Sprintf("%s hold=%v pause=%v rand=%x", s.Kind, s.Hold, s.Pause, s.Rand)
}

// Plan draws n fault steps of the given kinds from rnd. The holds scale
// with the session TTL: from TTL/2 to 1.5 x TTL, so some faults outlast
// sessions' leases and some do not.
func Plan(rnd *rand.Rand, kinds []string, n int, ttl time.Duration) []Step {
	var out []Step
	for range n {
		k := kinds[rnd.IntN(len(kinds))]
		hold := ttl/2 + time.Duration(rnd.Int64N(int64(ttl)))
		switch k {
		case LeaderChurn, LeaderHandoff, LeaderTransfer:
			hold = 2*ttl + time.Duration(rnd.Int64N(int64(ttl)))
		case PauseLeader, PauseHolder:
			// Longer than the TTL: the paused process's leases run out.
			hold = ttl + ttl/4 + time.Duration(rnd.Int64N(int64(ttl/2)))
		}
		out = append(out, Step{Kind: k, Hold: hold.Round(time.Millisecond), Pause: (300*time.Millisecond + time.Duration(rnd.Int64N(int64(500*time.Millisecond)))).Round(time.Millisecond), Rand: rnd.Uint64()})
	}
	return out
}

// nemesis carries out a plan against a system, recording every action and
// every availability measurement in the history.
type nemesis struct {
	sys   System
	h     *history.History
	ttl   time.Duration
	errs  []string
	probe sync.WaitGroup
}

func (n *nemesis) errorf(format string, args ...any) {
	n.errs = append(n.errs, fmt.Sprintf(format, args...))
}

// run carries out the plan; it returns early if stop closes.
func (n *nemesis) run(plan []Step, stop <-chan struct{}) {
	for _, st := range plan {
		select {
		case <-stop:
			return
		default:
		}
		n.step(st)
		n.sys.Heal()
		n.restartAll()
		n.probe.Wait()
		sleep(st.Pause, stop)
	}
}

func sleep(d time.Duration, stop <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	}
}

func (n *nemesis) restartAll() {
	for _, id := range n.sys.Members() {
		if !contains(n.sys.Running(), id) {
			if err := n.sys.Restart(id); err != nil {
				n.errorf("restart %d: %v", id, err)
			} else {
				n.h.Fault("restart", "r%d", id)
			}
		}
	}
}

// healthyLeader waits for a leader with every replica running, and opens
// the probes' sessions, so that a leader loss is measured from a healthy
// cluster.
func (n *nemesis) healthyLeader() uint64 {
	l := n.sys.WaitLeader(5 * time.Second)
	if p, ok := n.sys.(interface{ PrepareProbes(context.Context) }); ok && l != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		p.PrepareProbes(ctx)
		cancel()
		l = n.sys.WaitLeader(5 * time.Second)
	}
	return l
}

// measure starts measuring the time from now until an acquire succeeds
// through a replica not in avoid (old is the lost leader, 0 if none).
// bounded measurements are checked against the availability bound.
func (n *nemesis) measure(fault string, old uint64, avoid []uint64, bounded bool) {
	lost := n.h.Now()
	n.probe.Add(1)
	done, watched := make(chan struct{}), make(chan struct{})
	rc := history.Recovery{Fault: fault, Lost: lost, Bounded: bounded}
	go func() {
		// Watch for the election, to tell it from the clients' retries.
		defer close(watched)
		for {
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if l := n.sys.Leader(); l != 0 && l != old {
				rc.Elected = n.h.Now()
				return
			}
		}
	}()
	go func() {
		defer n.probe.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			actx, acancel := context.WithTimeout(ctx, time.Second)
			t0 := n.h.Now()
			err := n.sys.Probe(actx, avoid)
			acancel()
			if os.Getenv("VERIFY_DEBUG") != "" {
				n.h.Fault("probe", "attempt %.1fms..%.1fms: %v", float64(t0)/1e6, float64(n.h.Now())/1e6, err)
			}
			if err == nil {
				rc.Recovered = n.h.Now()
				break
			}
			time.Sleep(time.Millisecond)
		}
		close(done)
		<-watched
		n.h.Recovered(rc)
	}()
}

func (n *nemesis) step(st Step) {
	rnd := rand.New(rand.NewPCG(st.Rand, 0x5eed))
	members := n.sys.Members()
	switch st.Kind {
	case IsolateLeader:
		l := n.healthyLeader()
		if l == 0 {
			n.h.Fault(st.Kind, "skipped: no leader")
			return
		}
		n.sys.Isolate(l)
		n.measure(st.Kind, l, []uint64{l}, true)
		n.h.Fault(st.Kind, "r%d isolated for %v", l, st.Hold)
		if p, ok := n.sys.(Pauser); ok {
			// The minority keeps the old leader until CheckQuorum steps it
			// down (an election timeout); then it sees none.
			early := min(n.sys.ElectionTimeout()/2, st.Hold)
			time.Sleep(early)
			n.h.Fault(st.Kind, "after %v: r%d sees leader r%d", early, l, p.View(l))
			time.Sleep(st.Hold - early)
			n.h.Fault(st.Kind, "before the heal: r%d sees leader r%d, the others r%d", l, p.View(l), n.sys.Leader())
		} else {
			time.Sleep(st.Hold)
		}
	case OneWayCut:
		l := n.sys.Leader()
		var cuts []string
		if l != 0 && rnd.IntN(2) == 0 {
			for _, f := range without(members, l) {
				n.sys.Cut(l, f)
				cuts = append(cuts, fmt.Sprintf("r%d->r%d", l, f))
			}
		} else {
			for range 1 + rnd.IntN(2) {
				a := members[rnd.IntN(len(members))]
				b := without(members, a)[rnd.IntN(len(members)-1)]
				n.sys.Cut(a, b)
				cuts = append(cuts, fmt.Sprintf("r%d->r%d", a, b))
			}
		}
		n.h.Fault(st.Kind, "%s for %v", strings.Join(cuts, " "), st.Hold)
		time.Sleep(st.Hold)
	case Bridge:
		l := n.healthyLeader()
		perm := slices.Clone(members)
		rnd.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
		bridge, rest := perm[0], perm[1:]
		left, right := rest[:len(rest)/2], rest[len(rest)/2:]
		// The bridge is in neither group: its links stay up.
		n.sys.Partition(slices.Clone(left), slices.Clone(right))
		n.h.Fault(st.Kind, "%v | bridge r%d | %v for %v (leader r%d)", left, bridge, right, st.Hold, l)
		time.Sleep(st.Hold)
	case LeaderDeaf:
		l := n.healthyLeader()
		if l == 0 {
			n.h.Fault(st.Kind, "skipped: no leader")
			return
		}
		from := without(members, l)
		if rnd.IntN(2) == 0 {
			from = append(from, n.sys.Clients()...)
		}
		for _, f := range from {
			n.sys.Cut(f, l)
		}
		n.measure(st.Kind, l, []uint64{l}, false)
		n.h.Fault(st.Kind, "%v -> r%d cut for %v", from, l, st.Hold)
		time.Sleep(st.Hold)
		if p, ok := n.sys.(Pauser); ok {
			// It steps down (CheckQuorum) and, hearing nothing, never
			// learns who leads next.
			n.h.Fault(st.Kind, "before the heal: r%d sees leader r%d, the others r%d", l, p.View(l), n.sys.Leader())
		}
	case ClientOneWay:
		l := n.sys.Leader()
		var cuts []string
		for _, c := range n.sys.Clients() {
			to := members
			if l != 0 && rnd.IntN(2) == 0 {
				to = []uint64{l}
			}
			send := rnd.IntN(2) == 0
			for _, r := range to {
				if send {
					n.sys.Cut(c, r)
					cuts = append(cuts, fmt.Sprintf("c%d->r%d", c, r))
				} else {
					n.sys.Cut(r, c)
					cuts = append(cuts, fmt.Sprintf("r%d->c%d", r, c))
				}
			}
		}
		n.h.Fault(st.Kind, "%s for %v", strings.Join(cuts, " "), st.Hold)
		time.Sleep(st.Hold)
	case Partition:
		l := n.healthyLeader()
		perm := slices.Clone(members)
		rnd.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
		cut := 1 + rnd.IntN(len(perm)-1)
		groups := [][]uint64{slices.Clone(perm[:cut]), slices.Clone(perm[cut:])}
		for _, c := range n.sys.Clients() {
			if g := rnd.IntN(3); g < 2 {
				groups[g] = append(groups[g], c)
			}
		}
		n.sys.Partition(groups...)
		majority := len(members)/2 + 1
		for _, g := range groups {
			if l != 0 && contains(g, l) && countMembers(g, members) < majority {
				var avoid []uint64
				for _, id := range g {
					if contains(members, id) {
						avoid = append(avoid, id)
					}
				}
				n.measure(st.Kind, l, avoid, true)
			}
		}
		n.h.Fault(st.Kind, "%v | %v for %v (leader r%d)", groups[0], groups[1], st.Hold, l)
		time.Sleep(st.Hold)
	case DelayDrop:
		var what []string
		for _, a := range members {
			for _, b := range without(members, a) {
				if rnd.IntN(2) == 0 {
					d := time.Duration(1+rnd.IntN(20)) * time.Millisecond
					n.sys.SetDelay(a, b, d)
					what = append(what, fmt.Sprintf("r%d->r%d+%v", a, b, d))
				}
				if rnd.IntN(3) == 0 {
					p := 0.02 + 0.13*rnd.Float64()
					n.sys.SetDrop(a, b, p)
					what = append(what, fmt.Sprintf("r%d->r%d drop %.2f", a, b, p))
				}
			}
		}
		n.h.Fault(st.Kind, "%s for %v", strings.Join(what, " "), st.Hold)
		time.Sleep(st.Hold)
	case KillMinority:
		l := n.healthyLeader()
		k := 1 + rnd.IntN((len(members)-1)/2)
		perm := slices.Clone(members)
		rnd.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
		victims := perm[:k]
		withLeader := rnd.IntN(2) == 0
		if l != 0 && withLeader && !contains(victims, l) {
			victims[0] = l
		}
		if l != 0 && !withLeader && contains(victims, l) {
			victims = without(perm, l)[:k]
		}
		for _, id := range victims {
			n.sys.Stop(id)
		}
		if l != 0 && contains(victims, l) {
			n.measure(st.Kind, l, victims, true)
		}
		n.h.Fault(st.Kind, "stopped %v (leader r%d) for %v", victims, l, st.Hold)
		time.Sleep(st.Hold)
	case RestartAll:
		n.healthyLeader()
		perm := slices.Clone(members)
		rnd.Shuffle(len(perm), func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
		for _, id := range perm {
			n.sys.Stop(id)
		}
		down := time.Duration(50+rnd.IntN(250)) * time.Millisecond
		time.Sleep(down)
		n.restartAll()
		n.measure(st.Kind, 0, nil, false)
		n.h.Fault(st.Kind, "all stopped (order %v) for %v", perm, down)
	case LeaderChurn:
		// Long enough for the others to elect a new leader.
		et := n.sys.ElectionTimeout()
		rounds := n.leaderRounds(st.Kind, st.Hold, 3*et, func(l uint64) string {
			n.sys.Isolate(l)
			return fmt.Sprintf("r%d isolated", l)
		}, n.sys.Heal)
		n.h.Fault(st.Kind, "%d leader changes forced", rounds)
	case LeaderHandoff:
		rounds := n.leaderRounds(st.Kind, st.Hold, n.sys.ElectionTimeout(), func(l uint64) string {
			n.sys.Shutdown(l)
			return fmt.Sprintf("r%d shut down (hands leadership over)", l)
		}, n.restartAll)
		n.h.Fault(st.Kind, "%d leaders shut down", rounds)
	case ClientCrash:
		cs := n.sys.Clients()
		if len(cs) == 0 {
			n.h.Fault(st.Kind, "skipped: no remote clients")
			return
		}
		i := rnd.IntN(len(cs))
		if err := n.sys.CrashClient(i); err != nil {
			n.errorf("crash client %d: %v", i, err)
		}
		n.h.Fault(st.Kind, "c%d crashed and redialled", i)
		time.Sleep(st.Hold)
	case LeaderTransfer:
		t, ok := n.sys.(Transferrer)
		if !ok {
			n.h.Fault(st.Kind, "skipped: the system cannot transfer leadership")
			return
		}
		et := n.sys.ElectionTimeout()
		rounds := n.leaderRounds(st.Kind, st.Hold, et, func(l uint64) string {
			fs := without(members, l)
			to := fs[rnd.IntN(len(fs))]
			if !t.TransferLeader(l, to) {
				return fmt.Sprintf("r%d -> r%d: not sent (replica down)", l, to)
			}
			// Wait for the transfer (raft abandons it after an election
			// timeout).
			deadline := time.Now().Add(et)
			for l2 := n.sys.Leader(); (l2 == l || l2 == 0) && time.Now().Before(deadline); l2 = n.sys.Leader() {
				time.Sleep(2 * time.Millisecond)
			}
			return fmt.Sprintf("r%d -> r%d: leader now r%d, r%d running: %v", l, to, n.sys.Leader(), l, contains(n.sys.Running(), l))
		}, func() {})
		n.h.Fault(st.Kind, "%d leadership transfers", rounds)
	case CrashPoint:
		c, ok := n.sys.(Crasher)
		if !ok {
			n.errorf("%s: only multi-process trials can crash a replica at a Ready-loop point", st.Kind)
			return
		}
		l := n.healthyLeader()
		victim := members[rnd.IntN(len(members))]
		if l != 0 && rnd.IntN(2) == 0 {
			victim = l
		}
		point := ReadyPoints[rnd.IntN(len(ReadyPoints))]
		pass := 1 + rnd.IntN(20)
		role := "a follower"
		if victim == l {
			role = "the leader"
		}
		if err := c.ArmCrash(victim, point, pass); err != nil {
			n.errorf("%s: arm r%d: %v", st.Kind, victim, err)
			return
		}
		n.h.Fault(st.Kind, "r%d (%s) armed to crash at %s, pass %d", victim, role, point, pass)
		armed := time.Now()
		deadline := armed.Add(st.Hold)
		for contains(n.sys.Running(), victim) && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		if contains(n.sys.Running(), victim) {
			n.h.Fault(st.Kind, "r%d did not reach it within %v: killed", victim, st.Hold)
			n.sys.Stop(victim)
			return
		}
		if victim == l && n.sys.Leader() != l {
			n.measure(st.Kind, l, []uint64{l}, true)
		}
		n.h.Fault(st.Kind, "r%d crashed (SIGKILL) at %s after %v", victim, point, time.Since(armed).Round(time.Millisecond))
		time.Sleep(max(0, time.Until(deadline)))
	case PauseLeader:
		p, ok := n.sys.(Pauser)
		if !ok {
			n.h.Fault(st.Kind, "skipped: the system cannot pause processes")
			return
		}
		l := n.healthyLeader()
		if l == 0 {
			n.h.Fault(st.Kind, "skipped: no leader")
			return
		}
		n.pause(p, st, fmt.Sprintf("r%d", l), l, "the leader")
	case PauseHolder:
		p, ok := n.sys.(Pauser)
		if !ok {
			n.h.Fault(st.Kind, "skipped: the system cannot pause processes")
			return
		}
		via, why := n.holderProcess(rnd)
		l := n.sys.Leader()
		var lid uint64
		if via == fmt.Sprintf("r%d", l) {
			lid = l
			why += ", the leader"
		}
		n.pause(p, st, via, lid, why)
	default:
		n.errorf("unknown fault %q", st.Kind)
	}
}

// pause freezes the process named via for st.Hold and resumes it,
// measuring the recovery if it is the leader (leader != 0), and records
// what it saw: the paused replica's view of the leader before it resumed
// and how many of its clients' calls the pause held.
func (n *nemesis) pause(p Pauser, st Step, via string, leader uint64, why string) {
	held := p.Held(via)
	if err := p.Pause(via); err != nil {
		n.errorf("%s: %v", st.Kind, err)
		return
	}
	if leader != 0 {
		n.measure(st.Kind, leader, []uint64{leader}, true)
	}
	n.h.Fault(st.Kind, "%s (%s) paused (%s) for %v", via, why, p.How(via), st.Hold)
	time.Sleep(st.Hold)
	view := ""
	if leader != 0 {
		view = fmt.Sprintf("; before it resumed r%d still saw leader r%d (r0: none, or no answer), the others r%d", leader, p.View(leader), n.sys.Leader())
	}
	p.Resume(via)
	// Let the held clients run into the fence.
	time.Sleep(50 * time.Millisecond)
	n.h.Fault(st.Kind, "%s resumed%s; %d fenced writes held by the pause", via, view, p.Held(via)-held)
}

// holderProcess returns the endpoint (process) hosting a session that
// holds one of the locks now, preferring a remote client, and why; a
// random remote client if no holder is found.
func (n *nemesis) holderProcess(rnd *rand.Rand) (string, string) {
	names := slices.Clone(n.h.Locks)
	rnd.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	var found, why string
	for _, name := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		info, err := n.sys.Read(ctx, name)
		cancel()
		if err != nil || info.Holder == 0 {
			continue
		}
		via := n.via(info.Holder)
		if via == "" {
			continue
		}
		if found == "" || (strings.HasPrefix(via, "c") && !strings.HasPrefix(found, "c")) {
			found, why = via, fmt.Sprintf("hosts session %d, holder of %s under token %d", info.Holder, name, info.Token)
		}
	}
	if found == "" {
		cs := n.sys.Clients()
		if len(cs) == 0 {
			return fmt.Sprintf("r%d", n.sys.Members()[rnd.IntN(len(n.sys.Members()))]), "no holder found: a random replica"
		}
		return fmt.Sprintf("c%d", rnd.IntN(len(cs))), "no holder found: a random client"
	}
	return found, why
}

// via returns the endpoint that opened session id ("" if unknown).
func (n *nemesis) via(id uint64) string {
	var out string
	n.h.Update(func() {
		for _, s := range n.h.Sessions {
			if s.ID == id {
				out = s.Via
			}
		}
	})
	return out
}

// leaderRounds repeats, every TTL/2 until hold has passed: wait for a
// healthy leader, take it away with lose (which describes what it did),
// measure the recovery, wait down, undo it with back. It returns the
// number of rounds.
func (n *nemesis) leaderRounds(kind string, hold, down time.Duration, lose func(l uint64) string, back func()) int {
	end := time.Now().Add(hold)
	rounds := 0
	for time.Now().Before(end) {
		if l := n.healthyLeader(); l != 0 {
			// Measured from before the fault: a graceful shutdown refuses
			// proposals while it hands leadership over.
			n.measure(kind, l, []uint64{l}, true)
			what := lose(l)
			n.h.Fault(kind, "%s", what)
			rounds++
			time.Sleep(down)
			n.probe.Wait()
			back()
		}
		time.Sleep(max(0, n.ttl/2-down))
	}
	return rounds
}

func countMembers(g, members []uint64) int {
	k := 0
	for _, id := range g {
		if contains(members, id) {
			k++
		}
	}
	return k
}
