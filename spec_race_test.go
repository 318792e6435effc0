package quorumlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
)

// An Acquire cancelled (not timed out) while its grant races with the
// holder's release has a definite outcome, through a client as on a
// replica: the Lock with a nil error exactly when the table shows the
// grant, and otherwise the session is not left queued.
func TestSpecCancelRacesGrant(t *testing.T) {
	nodes := specCluster(t, 3, nil)
	for _, tc := range specOpeners(t, nodes) {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t, 60*time.Second)
			h := specSession(ctx, t, tc.o)
			w := specSession(ctx, t, tc.o)
			var granted, withdrawn int
			for i := range 15 {
				name := fmt.Sprint(tc.name, "-race-", i)
				actx, acancel := context.WithTimeout(ctx, 10*time.Second)
				hl, err := h.Acquire(actx, name)
				acancel()
				if err != nil {
					info, _ := tc.o.Holder(ctx, name)
					t.Fatalf("%s: holder's Acquire of a free lock: %v (table %+v, granted %d withdrawn %d)", name, err, info, granted, withdrawn)
				}
				wctx, cancel := context.WithCancel(ctx)
				res := make(chan error, 1)
				var wl *quorumlock.Lock
				go func() {
					var err error
					wl, err = w.Acquire(wctx, name)
					res <- err
				}()
				for {
					info, err := tc.o.Holder(ctx, name)
					if err != nil {
						t.Fatal(err)
					}
					if slices.Contains(info.Waiters, w.ID()) {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				// Release first, or cancel first, a little apart.
				d := time.Duration(i%4) * time.Millisecond
				if i%2 == 0 {
					go hl.Release(ctx)
					time.Sleep(d)
					cancel()
				} else {
					cancel()
					time.Sleep(d)
					go hl.Release(ctx)
				}
				err = <-res
				info, herr := tc.o.Holder(ctx, name)
				if herr != nil {
					t.Fatal(herr)
				}
				switch {
				case err == nil:
					granted++
					if info.Holder != w.ID() || info.Token != wl.Token() || wl.Token() <= hl.Token() {
						t.Fatalf("%s: granted token %d, table %+v", name, wl.Token(), info)
					}
				case errors.Is(err, context.Canceled):
					withdrawn++
					if info.Holder == w.ID() || slices.Contains(info.Waiters, w.ID()) {
						t.Fatalf("%s: withdrawn, but the table shows %+v", name, info)
					}
				default:
					t.Fatalf("%s: Acquire: %v", name, err)
				}
			}
			if closed(w.Done()) {
				t.Fatalf("session ended: %v", w.Err())
			}
			t.Logf("granted %d, withdrawn %d", granted, withdrawn)
		})
	}
}
