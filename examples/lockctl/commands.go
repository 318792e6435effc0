package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"github.com/quorumlock/quorumlock"
)

func statusCmd(fs *flag.FlagSet) func(context.Context, *env) error {
	asJSON := fs.Bool("json", false, "print JSON")
	return func(ctx context.Context, e *env) error {
		if len(e.args) != 0 {
			return errUsage
		}
		cl, err := e.dial(ctx)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, e.g.timeout)
		defer cancel()
		all := cl.Status(ctx)
		// The leader is the replica that says so at the highest term: a
		// deposed leader that has not heard of the new term yet may still
		// call itself leader.
		// A replica asked that is not the leader still names it: the
		// cluster has a leader when any replica that answered knows one,
		// whether or not the leader's address is among the endpoints.
		var leader, term uint64
		failed, known := 0, false
		for _, r := range all {
			if r.Err != nil {
				failed++
				continue
			}
			if r.Leader == r.ID && r.Term >= term {
				leader, term = r.ID, r.Term
			}
			known = known || r.Leader != 0
		}
		if *asJSON {
			type row struct {
				Addr     string `json:"addr"`
				ID       uint64 `json:"id,omitempty"`
				Leader   uint64 `json:"leader,omitempty"`
				IsLeader bool   `json:"is_leader,omitempty"`
				Term     uint64 `json:"term,omitempty"`
				Commit   uint64 `json:"commit,omitempty"`
				Applied  uint64 `json:"applied,omitempty"`
				Error    string `json:"error,omitempty"`
			}
			rows := make([]row, 0, len(all))
			for _, r := range all {
				x := row{Addr: r.Addr, ID: r.ID, Leader: r.Leader, IsLeader: r.Err == nil && r.ID == leader, Term: r.Term, Commit: r.Commit, Applied: r.Applied}
				if r.Err != nil {
					x = row{Addr: r.Addr, Error: r.Err.Error()}
				}
				rows = append(rows, x)
			}
			if err := writeJSON(e, rows); err != nil {
				return err
			}
		} else {
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tADDRESS\tLEADER\tTERM\tCOMMIT\tAPPLIED")
			for _, r := range all {
				if r.Err != nil {
					// Every column filled, so that the rows below stay aligned.
					fmt.Fprintf(tw, "?\t%s\t-\t-\t-\t-\terror: %s\n", r.Addr, oneLine(r.Err))
					continue
				}
				id := strconv.FormatUint(r.ID, 10)
				if r.ID == leader {
					id += "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\n", id, r.Addr, r.Leader, r.Term, r.Commit, r.Applied)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
		if failed > 0 {
			return fmt.Errorf("%d of %d replicas did not answer", failed, len(all))
		}
		if !known {
			return errors.New("no replica reports a leader")
		}
		return nil
	}
}

func locksCmd(fs *flag.FlagSet) func(context.Context, *env) error {
	after := fs.String("after", "", "list locks whose names sort after `NAME` (roles sort first and are skipped)")
	limit := fs.Int("limit", 100, "at most `N` entries per page (at most 10000)")
	all := fs.Bool("all", false, "page through every lock and role")
	asJSON := fs.Bool("json", false, "print JSON")
	return func(ctx context.Context, e *env) error {
		if len(e.args) != 0 {
			return errUsage
		}
		if err := checkLimit(*limit); err != nil {
			return err
		}
		cl, err := e.dial(ctx)
		if err != nil {
			return err
		}
		var out []quorumlock.LockEntry
		cursor := *after
		for {
			rctx, cancel := context.WithTimeout(ctx, e.g.timeout)
			page, more, err := cl.Locks(rctx, cursor, *limit)
			cancel()
			if err != nil {
				return err
			}
			out = append(out, page...)
			if !more || len(page) == 0 {
				break
			}
			last := page[len(page)-1]
			if !*all {
				if last.Role {
					fmt.Fprintln(e.stderr, "more entries follow: use -all")
				} else {
					fmt.Fprintf(e.stderr, "more entries follow: use -after %q or -all\n", last.Name)
				}
				break
			}
			cursor = lockCursor(last)
		}
		if *asJSON {
			type row struct {
				Name    string   `json:"name"`
				Role    bool     `json:"role,omitempty"`
				Holder  uint64   `json:"holder"`
				Token   uint64   `json:"token"`
				Waiters []uint64 `json:"waiters"`
				Value   string   `json:"value,omitempty"`
			}
			rows := make([]row, 0, len(out))
			for _, l := range out {
				rows = append(rows, row{Name: l.Name, Role: l.Role, Holder: l.Holder, Token: uint64(l.Token), Waiters: append([]uint64{}, l.Waiters...), Value: string(l.Value)})
			}
			return writeJSON(e, rows)
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tKIND\tHOLDER\tTOKEN\tWAITERS\tVALUE")
		for _, l := range out {
			kind, value := "lock", ""
			if l.Role {
				kind, value = "role", printable(l.Value)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", printable([]byte(l.Name)), kind, l.Holder, l.Token, joinIDs(l.Waiters), value)
		}
		return tw.Flush()
	}
}

// checkLimit refuses a page size below 1: Client.Locks and Client.Sessions
// would take 0 or less as their default of 100, not as what was asked.
func checkLimit(n int) error {
	if n < 1 {
		return fmt.Errorf("%w: -limit %d: want 1 or more", errUsage, n)
	}
	return nil
}

// lockCursor is what to pass as Client.Locks' after to continue past e.
func lockCursor(e quorumlock.LockEntry) string { return e.Cursor }

func sessionsCmd(fs *flag.FlagSet) func(context.Context, *env) error {
	after := fs.Uint64("after", 0, "list sessions with IDs above `ID`")
	limit := fs.Int("limit", 100, "at most `N` sessions per page (at most 10000)")
	all := fs.Bool("all", false, "page through every session")
	asJSON := fs.Bool("json", false, "print JSON")
	return func(ctx context.Context, e *env) error {
		if len(e.args) != 0 {
			return errUsage
		}
		if err := checkLimit(*limit); err != nil {
			return err
		}
		cl, err := e.dial(ctx)
		if err != nil {
			return err
		}
		var out []quorumlock.SessionEntry
		cursor := *after
		for {
			rctx, cancel := context.WithTimeout(ctx, e.g.timeout)
			page, more, err := cl.Sessions(rctx, cursor, *limit)
			cancel()
			if err != nil {
				return err
			}
			out = append(out, page...)
			if !more || len(page) == 0 {
				break
			}
			cursor = page[len(page)-1].ID
			if !*all {
				fmt.Fprintf(e.stderr, "more sessions follow: use -after %d or -all\n", cursor)
				break
			}
		}
		if *asJSON {
			type row struct {
				ID    uint64 `json:"id"`
				TTLMs int64  `json:"ttl_ms"`
				Held  int    `json:"held"`
			}
			rows := make([]row, 0, len(out))
			for _, s := range out {
				rows = append(rows, row{ID: s.ID, TTLMs: s.TTL.Milliseconds(), Held: s.Held})
			}
			return writeJSON(e, rows)
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTTL\tHELD")
		for _, s := range out {
			fmt.Fprintf(tw, "%d\t%v\t%d\n", s.ID, s.TTL, s.Held)
		}
		return tw.Flush()
	}
}

func revokeCmd(fs *flag.FlagSet) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		if len(e.args) != 1 {
			return errUsage
		}
		id, err := strconv.ParseUint(e.args[0], 10, 64)
		if err != nil || id == 0 {
			return fmt.Errorf("%w: session ID %q: want a positive integer", errUsage, e.args[0])
		}
		cl, err := e.dial(ctx)
		if err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, e.g.timeout)
		defer cancel()
		if err := cl.RevokeSession(rctx, id); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "revoked session %d\n", id)
		return nil
	}
}

func leaderCmd(fs *flag.FlagSet) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		if len(e.args) != 1 {
			return errUsage
		}
		cl, err := e.dial(ctx)
		if err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, e.g.timeout)
		defer cancel()
		li, err := cl.Leader(rctx, e.args[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "role=%s session=%d epoch=%d value=%s\n", printable([]byte(li.Role)), li.Session, li.Epoch, printable(li.Value))
		return nil
	}
}

func observeCmd(fs *flag.FlagSet) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		if len(e.args) != 1 {
			return errUsage
		}
		cl, err := e.dial(ctx)
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		for li := range cl.Observe(ctx, e.args[0]) {
			if li.HasLeader() {
				fmt.Fprintf(e.stdout, "leader session=%d epoch=%d value=%s\n", li.Session, li.Epoch, printable(li.Value))
			} else {
				fmt.Fprintf(e.stdout, "no leader (last epoch %d)\n", li.Epoch)
			}
		}
		if ctx.Err() == nil {
			// The stream closes at once for a role the cluster refuses
			// (empty, or longer than its MaxNameBytes and not held): say so, as leader
			// does, rather than only that it ended.
			if _, err := cl.Leader(ctx, e.args[0]); errors.Is(err, quorumlock.ErrInvalidName) {
				return err
			}
			return errors.New("observe stream ended")
		}
		return nil
	}
}

func writeJSON(e *env, v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func joinIDs(ids []uint64) string {
	if len(ids) == 0 {
		return "-"
	}
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(parts, ",")
}

// printable shows b as is when it is plain printable text, quoted
// otherwise, so that a table stays a table.
func printable(b []byte) string {
	s := string(b)
	if s == "" {
		return `""`
	}
	if !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) {
		return strconv.Quote(s)
	}
	return s
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
