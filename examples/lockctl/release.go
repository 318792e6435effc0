package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"

	"github.com/quorumlock/quorumlock"
)

// releaseCmd frees a lock held by another process, such as a "lockctl
// acquire NAME" a script left holding in the background. A lock belongs to
// the session that acquired it and only that session's process can release
// it with Lock.Release; from outside, the only way to free it is to end
// the holder's session with Client.RevokeSession, which frees the session's
// locks through the log (the next grant has a larger token). So release
// frees NAME only when that is all the revocation frees:
//
//   - NAME is held (else exit 1: nothing to release);
//   - with -token T, the current grant is T (else exit 1): a release meant
//     for an earlier grant never frees a newer one, as with Lock.Release;
//   - the holder's session holds nothing but NAME: no other lock and no
//     role (else exit 1, pointing to revoke-session).
//
// The checks are linearizable reads, in this order: Holder(NAME), the
// holder's entry in Sessions, Holder(NAME) again. Tokens are log indexes,
// never given out twice, so the same grant in both Holder reads means the
// session held NAME throughout, and held exactly NAME when its entry said it
// held one lock or role. The revocation is a separate command after the
// reads: a holder that, within that round trip, releases NAME or takes
// another lock loses whatever it then holds. A lockctl acquire holding NAME
// does neither.
func releaseCmd(fs *flag.FlagSet) func(context.Context, *env) error {
	var token uint64
	fs.Func("token", "free NAME only if its current grant has fencing token `T` (the one acquire printed)", func(s string) error {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil || v == 0 {
			return errors.New("want a positive fencing token")
		}
		token = v
		return nil
	})
	return func(ctx context.Context, e *env) error {
		if len(e.args) != 1 {
			return errUsage
		}
		name := e.args[0]
		cl, err := e.dial(ctx)
		if err != nil {
			return err
		}
		holder := func() (quorumlock.LockInfo, error) {
			rctx, cancel := context.WithTimeout(ctx, e.g.timeout)
			defer cancel()
			return cl.Holder(rctx, name)
		}
		info, err := holder()
		if err != nil {
			return err
		}
		if info.Holder == 0 {
			return fmt.Errorf("lock %q is not held: nothing to release", name)
		}
		if token != 0 && uint64(info.Token) != token {
			return fmt.Errorf("lock %q is held by session %d with token %d, not %d: not released", name, info.Holder, info.Token, token)
		}

		rctx, cancel := context.WithTimeout(ctx, e.g.timeout)
		page, _, err := cl.Sessions(rctx, info.Holder-1, 1)
		cancel()
		if err != nil {
			return err
		}
		held := -1 // not listed: the session ended
		if len(page) == 1 && page[0].ID == info.Holder {
			held = page[0].Held
		}
		again, err := holder()
		if err != nil {
			return err
		}
		if again.Holder != info.Holder || again.Token != info.Token || held < 1 {
			return fmt.Errorf("lock %q changed hands while release checked it (session %d with token %d, then session %d with token %d): not released",
				name, info.Holder, info.Token, again.Holder, again.Token)
		}
		if held > 1 {
			return fmt.Errorf("session %d holds %d other locks or roles besides %q: not released. release frees a lock by ending its holder's session, "+
				"so only when the session holds nothing else; to end the session and free all its locks, use lockctl revoke-session %d",
				info.Holder, held-1, name, info.Holder)
		}

		rctx, cancel = context.WithTimeout(ctx, e.g.timeout)
		defer cancel()
		if err := cl.RevokeSession(rctx, info.Holder); err != nil {
			if errors.Is(err, quorumlock.ErrSessionExpired) {
				return fmt.Errorf("session %d, holder of %q with token %d, ended before release could revoke it (it expired or was closed); not released by this command: %w",
					info.Holder, name, info.Token, err)
			}
			return err
		}
		fmt.Fprintf(e.stdout, "released %s: revoked session %d, which held it with token %d\n", printable([]byte(name)), info.Holder, info.Token)
		return nil
	}
}
