package check

import (
	"fmt"
	"time"
)

// checkAvailability checks that after every leader loss an acquire
// succeeded again within the history's Bound (2 x election timeout + a
// margin), and collects the distribution.
func checkAvailability(x *index, r *Report) {
	for _, rc := range x.h.Recover {
		if rc.Recovered == 0 {
			r.add(Availability, "", "no acquire succeeded after the leader loss (%s) at %s", rc.Fault, ms(rc.Lost))
			continue
		}
		d := time.Duration(rc.Recovered - rc.Lost)
		if !rc.Bounded {
			r.Unbounded = append(r.Unbounded, d)
			continue
		}
		r.Recoveries = append(r.Recoveries, d)
		elected := "no new leader seen"
		if rc.Elected != 0 {
			e := time.Duration(rc.Elected - rc.Lost)
			r.Elections = append(r.Elections, e)
			elected = fmt.Sprintf("a new leader after %v", e.Round(time.Millisecond))
		}
		if x.h.Bound > 0 && rc.Recovered-rc.Lost > x.h.Bound {
			r.add(Availability, "", "after the leader loss (%s) at %s the next acquire succeeded after %v (%s), above the bound %v",
				rc.Fault, ms(rc.Lost), d.Round(time.Millisecond), elected, time.Duration(x.h.Bound))
		}
	}
}
