package raftnode

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3"

	"github.com/quorumlock/quorumlock/clock"
)

// TestReviewAFNewChecksBootstrapPeers: Config documents ID as "one of
// Peers" and Peers as the IDs of every voter. Bootstrapping an empty log
// with Peers that do not hold ID used to succeed with a node that is no
// voter (it never campaigns, a read on it never returns); a zero ID or a
// duplicate was silently dropped by raft (Peers {1, 0} became a cluster of
// one voter). New now refuses each with an error naming Peers.
func TestReviewAFNewChecksBootstrapPeers(t *testing.T) {
	for _, c := range []struct {
		what  string
		peers []uint64
	}{
		{"Peers without ID", []uint64{2, 3}},
		{"Peers holding 0", []uint64{1, 0}},
		{"Peers holding an ID twice", []uint64{1, 1, 2}},
		{"no Peers", nil},
	} {
		n, err := New(Config{ID: 1, Peers: c.peers, Storage: newMemStore(), Transport: nopTransport{}, StateMachine: &recSM{}})
		if err == nil {
			n.Stop()
			t.Errorf("New with %s (%v) on an empty log: no error", c.what, c.peers)
			continue
		}
		if !strings.Contains(err.Error(), "Peers") {
			t.Errorf("New with %s: error %q does not name Peers", c.what, err)
		}
	}
	n, err := New(Config{ID: 3, Peers: []uint64{1, 2, 3}, Storage: newMemStore(), Transport: nopTransport{}, StateMachine: &recSM{}})
	if err != nil {
		t.Fatalf("New with valid Peers: %v", err)
	}
	n.Stop()
}

// TestReviewAFNewNamesMissingField: New's doc promises "an error naming the
// field" when ID, Storage, Transport or StateMachine is missing; the error
// named all four whichever was missing.
func TestReviewAFNewNamesMissingField(t *testing.T) {
	full := Config{ID: 1, Peers: []uint64{1}, Storage: newMemStore(), Transport: nopTransport{}, StateMachine: &recSM{}}
	for field, cfg := range map[string]Config{
		"ID":           func(c Config) Config { c.ID = 0; return c }(full),
		"Storage":      func(c Config) Config { c.Storage = nil; return c }(full),
		"Transport":    func(c Config) Config { c.Transport = nil; return c }(full),
		"StateMachine": func(c Config) Config { c.StateMachine = nil; return c }(full),
	} {
		_, err := New(cfg)
		if err == nil {
			t.Errorf("New without %s: no error", field)
			continue
		}
		for _, other := range []string{"ID", "Storage", "Transport", "StateMachine"} {
			if named := strings.Contains(err.Error(), "Config."+other+" "); named != (other == field) {
				t.Errorf("New without %s: error %q; want it to name Config.%s only", field, err, field)
			}
		}
	}
}

// TestReviewAFProposeAsyncAfterStop: ProposeAsync documents ErrStopped "if
// it could not be queued"; on a stopped node the entry can never be
// applied or refused. The node's queue is buffered, so the select between
// queueing and the closed Done picked at random and about half of the calls
// returned nil, as if the entry were on its way. Every call must return
// ErrStopped.
func TestReviewAFProposeAsyncAfterStop(t *testing.T) {
	n, err := New(Config{ID: 1, Peers: []uint64{1}, Storage: newMemStore(), Transport: nopTransport{}, StateMachine: &recSM{}})
	if err != nil {
		t.Fatal(err)
	}
	n.Start()
	n.Stop()
	ctx := context.Background()
	for i := range 64 {
		if err := n.ProposeAsync(ctx, AsyncProposal{Data: []byte("x")}); !errors.Is(err, ErrStopped) {
			t.Fatalf("ProposeAsync #%d after Stop = %v, want ErrStopped", i, err)
		}
	}
}

// TestReviewAFStatusAfterStopKeepsLastView pins down what Status documents
// for a stopped node: the state it last published, its own leadership
// included, while LeaderLost has been called.
func TestReviewAFStatusAfterStopKeepsLastView(t *testing.T) {
	sm := &recSM{}
	clk := clock.NewManual(time.Unix(0, 0))
	n, err := New(Config{ID: 1, Peers: []uint64{1}, Storage: newMemStore(), Transport: nopTransport{}, StateMachine: sm,
		Clock: clk, TickInterval: testTick, ElectionTicks: electionTicks})
	if err != nil {
		t.Fatal(err)
	}
	n.Start()
	deadline := time.Now().Add(waitTimeout)
	for n.Status().Leader != 1 {
		if time.Now().After(deadline) {
			n.Stop()
			t.Fatal("a single voter did not become leader")
		}
		clk.Advance(testTick)
		time.Sleep(time.Millisecond)
	}
	n.Stop()
	if st := n.Status(); st.Leader != 1 || st.State != raft.StateLeader {
		t.Fatalf("Status after Stop = %+v; want the last published view (leader 1)", st)
	}
	if sm.lastLeadershipEvent() != "lost" {
		t.Fatalf("last leadership event after Stop = %q, want lost", sm.lastLeadershipEvent())
	}
}
