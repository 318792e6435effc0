// Command lockctl is an admin CLI for a quorumlock cluster, over the client
// API (quorumlock.Dial): it works from any machine that reaches the
// replicas, such as the ones lockd runs.
//
//	lockctl -endpoints 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 status
//	lockctl locks -all
//	lockctl acquire backup -- ./backup.sh
//
// Run "lockctl -help" for the commands. Errors go to stderr and the exit
// status is 1 on failure, 2 for usage errors; acquire with a command exits
// with the command's status (128+N if signal N killed it).
//
// A lock belongs to the session that acquired it, and that session lives
// only inside the process that opened it: "lockctl acquire" releases its
// lock itself when its command exits or when it gets SIGINT or SIGTERM.
// From another process, a lock can only be freed by ending its holder's
// session through the log (the next waiter is granted with a larger
// fencing token, and the old holder learns at its next heartbeat):
//
//	lockctl acquire build-lock > token.txt &   # prints the token once granted, then holds
//	...
//	lockctl release -token "$(cat token.txt)" build-lock
//
// "release NAME" does that for a session that holds NAME and nothing else
// (and, with -token, only for that grant); it exits 1 without revoking
// anything if NAME is free or it refuses. Its checks are reads made before
// the revocation, so a holder that takes another lock in that round trip
// loses it too (lockctl acquire never does). "revoke-session ID" ends any
// session, whatever it holds. The holding "lockctl acquire" cannot tell a
// revocation from an expiry: it reports the lock lost and exits 1.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/quorumlock/quorumlock"
)

// errUsage marks errors already explained with a usage message.
var errUsage = errors.New("usage")

const defaultEndpoints = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"

// globals are the connection flags, accepted before the command and after
// it.
type globals struct {
	endpoints       string
	timeout         time.Duration
	electionTimeout time.Duration
	tlsCert         string
	tlsKey          string
	tlsCA           string
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.endpoints, "endpoints", g.endpoints, "replica `addresses`, comma-separated (env LOCKCTL_ENDPOINTS)")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "bound on connecting and on each request (not on acquire's wait)")
	fs.DurationVar(&g.electionTimeout, "election-timeout", g.electionTimeout, "the cluster's election timeout (tick × election-ticks)")
	fs.StringVar(&g.tlsCert, "tls-cert", g.tlsCert, "PEM client certificate `file`, for mutual TLS")
	fs.StringVar(&g.tlsKey, "tls-key", g.tlsKey, "PEM private key `file` of -tls-cert")
	fs.StringVar(&g.tlsCA, "tls-ca", g.tlsCA, "PEM `file` of the CA that signs the replicas' certificates; enables TLS")
}

// command is one subcommand: its usage, and setup, which registers its
// flags (besides the globals) and returns what it does.
type command struct {
	name  string
	args  string
	help  string
	setup func(fs *flag.FlagSet) func(ctx context.Context, e *env) error
}

// env is what a running command gets.
type env struct {
	g      *globals
	args   []string
	stdout io.Writer
	stderr io.Writer
	client *quorumlock.Client // dialled lazily by dial
}

var commands = []command{
	{"status", "[-json]", "each replica's ID, known leader, term, commit and applied indexes; * marks the leader; exits 1 if a replica does not answer or none leads", statusCmd},
	{"locks", "[-after NAME] [-limit N] [-all] [-json]", "held locks and roles: holder session, fencing token, waiters, role values", locksCmd},
	{"sessions", "[-after ID] [-limit N] [-all] [-json]", "live sessions: ID, TTL, locks held", sessionsCmd},
	{"acquire", "[-ttl D] [-wait D] [-kill-grace D] NAME [--] [COMMAND [ARGS...]]", "hold the lock NAME while COMMAND runs (env QUORUMLOCK_TOKEN, QUORUMLOCK_NAME, QUORUMLOCK_SESSION) and exit with its status; without COMMAND, print the token and hold until SIGINT/SIGTERM (then it releases the lock and exits 0); exits 1 if the lock is lost (its session expired or was revoked, as release does), after stopping COMMAND", acquireCmd},
	{"release", "[-token T] NAME", "free the lock NAME held by another process (such as acquire without COMMAND) by revoking its holder's session: only if that session holds nothing else (else use revoke-session) and, with -token, only if the current grant has token T; the next grant has a larger token; exits 1 if NAME is not held or nothing was released", releaseCmd},
	{"revoke-session", "ID", "end session ID by force: its locks go to their next waiters with larger tokens", revokeCmd},
	{"leader", "ROLE", "the current leader of ROLE: session, epoch, value; exits 1 if none", leaderCmd},
	{"observe", "ROLE", "print every leadership change of ROLE until interrupted", observeCmd},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	g := &globals{endpoints: defaultEndpoints, timeout: 5 * time.Second, electionTimeout: time.Second}
	if v := os.Getenv("LOCKCTL_ENDPOINTS"); v != "" {
		g.endpoints = v
	}
	top := flag.NewFlagSet("lockctl", flag.ContinueOnError)
	top.SetOutput(stderr)
	g.register(top)
	top.Usage = func() { usage(stderr, top) }
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if top.NArg() == 0 {
		usage(stderr, top)
		return 2
	}
	name := top.Arg(0)
	var cmd *command
	for i := range commands {
		if commands[i].name == name {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "lockctl: unknown command %q\n", name)
		usage(stderr, top)
		return 2
	}

	fs := flag.NewFlagSet("lockctl "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	// Registered with the current values as defaults: the globals given
	// before the command stay in force.
	g.register(fs)
	do := cmd.setup(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: lockctl %s %s\n\n%s\n\nflags:\n", name, cmd.args, cmd.help)
		fs.PrintDefaults()
	}
	if err := fs.Parse(top.Args()[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if g.timeout <= 0 || g.electionTimeout <= 0 {
		fmt.Fprintf(stderr, "lockctl: -timeout %v, -election-timeout %v: want positive durations\n", g.timeout, g.electionTimeout)
		fs.Usage()
		return 2
	}
	e := &env{g: g, args: fs.Args(), stdout: stdout, stderr: stderr}
	defer func() {
		if e.client != nil {
			e.client.Close()
		}
	}()
	err := do(context.Background(), e)
	var exit exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return int(exit)
	case errors.Is(err, errUsage):
		if err != errUsage {
			fmt.Fprintf(stderr, "lockctl %s: %v\n", name, err)
		}
		fs.Usage()
		return 2
	default:
		fmt.Fprintf(stderr, "lockctl %s: %v\n", name, err)
		return 1
	}
}

// exitError is an exit status to return without a message (acquire's
// command's status).
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "usage: lockctl [flags] COMMAND [command flags] [ARGS]")
	fmt.Fprintln(w, "\nAn admin CLI for a quorumlock cluster. Commands:")
	for _, c := range commands {
		fmt.Fprintf(w, "\n  %s %s\n      %s\n", c.name, c.args, c.help)
	}
	fmt.Fprintln(w, "\nA lock belongs to the session of the process that acquired it. release and")
	fmt.Fprintln(w, "revoke-session free locks from outside by ending that session through the log:")
	fmt.Fprintln(w, "release only a session holding just NAME, revoke-session any session.")
	fmt.Fprintln(w, "\nExit status: 0 on success, 2 on a usage error, 1 on any other failure (such as")
	fmt.Fprintln(w, "release finding NAME free, or refusing); acquire with a COMMAND exits with the")
	fmt.Fprintln(w, "command's status (128+N if killed by signal N).")
	fmt.Fprintln(w, "\nflags (also accepted after the command):")
	fs.PrintDefaults()
}

// dial connects to the cluster, within the -timeout.
func (e *env) dial(ctx context.Context) (*quorumlock.Client, error) {
	var addrs []string
	for a := range strings.SplitSeq(e.g.endpoints, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: no endpoints: set -endpoints or LOCKCTL_ENDPOINTS", errUsage)
	}
	opts := []quorumlock.ClientOption{quorumlock.WithElectionTimeout(e.g.electionTimeout)}
	if e.g.tlsCA != "" || e.g.tlsCert != "" || e.g.tlsKey != "" {
		cfg, err := clientTLS(e.g.tlsCert, e.g.tlsKey, e.g.tlsCA)
		if err != nil {
			return nil, err
		}
		opts = append(opts, quorumlock.WithTLS(cfg))
	}
	dctx, cancel := context.WithTimeout(ctx, e.g.timeout)
	defer cancel()
	cl, err := quorumlock.Dial(dctx, addrs, opts...)
	if err != nil {
		return nil, err
	}
	e.client = cl
	return cl, nil
}

// clientTLS: the replicas' CA (the system roots if none), and a client
// certificate when given.
func clientTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("%w: -tls-cert and -tls-key must be given together", errUsage)
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("TLS key pair: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("-tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-tls-ca: no PEM certificate in %s", caFile)
		}
	}
	return cfg, nil
}
