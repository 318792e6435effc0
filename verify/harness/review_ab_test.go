package harness

import (
	"regexp"
	"strings"
	"testing"
)

// Review AB: the opt-in fault kinds (ExtraFaultKinds) do what they say,
// and a trial with them passes.

// TestExtraFaultsAreCarriedOut runs one trial of each extra kind and
// checks the faults recorded: bridge splits the others around one
// replica, leader-deaf leaves the cut-off leader without a leader while
// the others elect one, client-one-way cuts a direction of every remote
// client's links.
func TestExtraFaultsAreCarriedOut(t *testing.T) {
	t.Run(Bridge, func(t *testing.T) {
		all := strings.Join(faultDetails(t, 3201, Bridge), "\n")
		if !regexp.MustCompile(`^\[\d+\] \| bridge r\d+ \| \[\d+\] for `).MatchString(all) {
			t.Fatalf("no bridge recorded:\n%s", all)
		}
	})
	t.Run(LeaderDeaf, func(t *testing.T) {
		all := strings.Join(faultDetails(t, 3202, LeaderDeaf), "\n")
		m := regexp.MustCompile(`before the heal: r(\d+) sees leader r(\d+), the others r(\d+)`).FindStringSubmatch(all)
		if m == nil {
			t.Fatalf("no view of the deaf leader recorded:\n%s", all)
		}
		if m[2] != "0" || m[3] == "0" || m[3] == m[1] {
			t.Fatalf("deaf r%s saw leader r%s, the others r%s: want none, and another leader elected", m[1], m[2], m[3])
		}
	})
	t.Run(ClientOneWay, func(t *testing.T) {
		all := strings.Join(faultDetails(t, 3203, ClientOneWay), "\n")
		if !regexp.MustCompile(`(c100->r\d+|r\d+->c100)`).MatchString(all) || !regexp.MustCompile(`(c101->r\d+|r\d+->c101)`).MatchString(all) {
			t.Fatalf("not every client's links cut:\n%s", all)
		}
	})
}
