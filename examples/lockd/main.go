// Command lockd runs one quorumlock replica as a standalone process: a
// sidecar for teams that do not link the library into their own replicas,
// and the process that multi-process tests start, kill and pause. Clients
// reach it with quorumlock.Dial; operators with lockctl.
//
//	lockd -id 1 -peers 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003 -data /var/lib/lockd/1
//
// Settings come from flags, from a JSON file given with -config, or both:
// a flag set on the command line overrides the file. The file uses the
// flag names with dashes turned into underscores; durations are strings,
// peers an object or a flag-style string:
//
//	{"id": 1, "peers": {"1": "10.0.0.1:7000", "2": "10.0.0.2:7000", "3": "10.0.0.3:7000"},
//	 "data": "/var/lib/lockd", "ttl": "10s", "tick": "100ms", "election_ticks": 10,
//	 "tls_cert": "node.pem", "tls_key": "node-key.pem", "tls_ca": "ca.pem"}
//
// With -tls-cert, -tls-key and -tls-ca, the replica serves peers and clients
// over mutual TLS: they must present a certificate signed by the CA, and the
// replica presents its certificate both as a server and, to its peers, as a
// client (so it needs the serverAuth and clientAuth extended key usages and
// the peer address as a SAN). With -tls-peer-ca too, the replicas'
// certificates come from that CA and the clients' from -tls-ca: a peer
// stream then needs a certificate of the peer CA, so a client's certificate
// cannot pose as a member (clients trust the peer CA for the servers). A
// -tls-cert that does not verify against -tls-peer-ca is a configuration
// error.
//
// lockd logs to stderr. Once it serves, it prints one line to stdout,
// "lockd ready id=N addr=ADDR". SIGTERM or SIGINT stops it cleanly (the log
// is closed; clients move on to the other replicas) with exit status 0; a
// second signal kills it at once. Exit status 2 is a usage or
// configuration error, 1 a failure to start, or the replica stopping on
// its own (a storage failure, a peer's message raft cannot accept: see
// quorumlock.Node.Done).
//
// With -metrics ADDR it serves the replica's Prometheus metrics (and the Go
// runtime's and the process's) at http://ADDR/metrics.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/quorumlock/quorumlock"
)

// configHooks change the Config before Start; only test builds add any
// (crashpoint.go, built with the tag crashpoint).
var configHooks []func(*quorumlock.Config)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	s, err := parseSettings(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "lockd:", err)
		return 2
	}
	cfg, log, err := s.config()
	if err != nil {
		fmt.Fprintln(stderr, "lockd:", err)
		return 2
	}
	defer log.Sync()

	// Signals are caught before Start so that a SIGTERM during start-up
	// still ends with status 0.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	// An address that cannot be bound is a failure to start (status 1, as
	// for the address in -peers), not a usage error: it may be free later.
	//
	// A separate listen address (say 0.0.0.0:7001) is bound here; peers and
	// clients are still told Peers[ID], which must reach it.
	if s.Listen != "" && s.Listen != s.Peers[s.ID] {
		lis, err := net.Listen("tcp", s.Listen)
		if err != nil {
			fmt.Fprintln(stderr, "lockd: -listen:", err)
			return 1
		}
		cfg.Listener = lis
	}
	if s.Metrics != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		cfg.Metrics = reg
		lis, err := net.Listen("tcp", s.Metrics)
		if err != nil {
			fmt.Fprintln(stderr, "lockd: -metrics:", err)
			return 1
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(lis) }()
		defer srv.Close()
		log.Info("serving metrics", zap.String("addr", lis.Addr().String()))
	}

	for _, h := range configHooks {
		h(&cfg)
	}
	node, err := quorumlock.Start(ctx, cfg)
	if err != nil && ctx.Err() != nil {
		log.Info("signal received during start-up", zap.Error(err))
		return 0
	}
	if err != nil {
		log.Error("start failed", zap.Error(err))
		fmt.Fprintln(stderr, "lockd:", err)
		if errors.Is(err, quorumlock.ErrInvalidConfig) {
			return 2
		}
		return 1
	}
	fmt.Fprintf(stdout, "lockd ready id=%d addr=%s\n", node.ID(), node.Addr())

	select {
	case <-ctx.Done():
	case <-node.Done():
		// The replica stopped on its own (a storage failure, a peer's
		// message raft cannot accept): exit, so that a supervisor
		// restarts lockd, rather than run on serving nothing.
		stop()
		log.Error("replica stopped", zap.Error(node.Err()))
		fmt.Fprintln(stderr, "lockd: replica stopped:", node.Err())
		node.Close()
		return 1
	}
	// Restore the default action: a second signal kills the process.
	stop()
	log.Info("signal received, shutting down")
	if err := node.Close(); err != nil {
		log.Error("close", zap.Error(err))
		return 1
	}
	return 0
}

// config turns the settings into a replica Config and its logger.
func (s *settings) config() (quorumlock.Config, *zap.Logger, error) {
	if s.ID == 0 {
		return quorumlock.Config{}, nil, errors.New("-id is required")
	}
	if len(s.Peers) == 0 {
		return quorumlock.Config{}, nil, errors.New("-peers is required")
	}
	if s.Data == "" {
		return quorumlock.Config{}, nil, errors.New("-data is required")
	}
	// Start reads a zero as "the default": refuse one here, or -ttl 0s
	// would run with a 10s TTL.
	switch {
	case s.TTL <= 0:
		return quorumlock.Config{}, nil, fmt.Errorf("-ttl %v: want a positive duration", s.TTL.d())
	case s.Tick <= 0:
		return quorumlock.Config{}, nil, fmt.Errorf("-tick %v: want a positive duration", s.Tick.d())
	case s.ElectionTicks <= 0:
		return quorumlock.Config{}, nil, fmt.Errorf("-election-ticks %d: want a positive number", s.ElectionTicks)
	case s.ClusterName == "":
		return quorumlock.Config{}, nil, errors.New("-cluster-name must not be empty")
	}
	log, err := newLogger(s.LogLevel)
	if err != nil {
		return quorumlock.Config{}, nil, err
	}
	cfg := quorumlock.Config{
		ID:            s.ID,
		Peers:         s.Peers,
		DataDir:       s.Data,
		ClusterName:   s.ClusterName,
		SessionTTL:    s.TTL.d(),
		TickInterval:  s.Tick.d(),
		ElectionTicks: s.ElectionTicks,
		Logger:        log,
	}
	if s.TLSCert != "" || s.TLSKey != "" || s.TLSCA != "" || s.TLSPeerCA != "" {
		if cfg.TLS, cfg.PeerTLS, err = loadTLS(s.TLSCert, s.TLSKey, s.TLSCA, s.TLSPeerCA); err != nil {
			return quorumlock.Config{}, nil, err
		}
	}
	return cfg, log, nil
}

func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("-log-level: %w", err)
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.Lock(os.Stderr), lvl)
	return zap.New(core), nil
}

// loadTLS builds the server side (certificate, client certificates required
// and verified against the CA) and the peer side (the same certificate as a
// client, servers verified against the CA) of mutual TLS. With peerCAFile,
// peers' certificates (this replica's included) come from that CA: the
// server trusts client certificates of both CAs, and the peer side, which
// the replica also checks a peer stream's certificate against, only the
// peer CA.
func loadTLS(certFile, keyFile, caFile, peerCAFile string) (server, peer *tls.Config, err error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		if peerCAFile != "" {
			return nil, nil, errors.New("-tls-peer-ca needs -tls-cert, -tls-key and -tls-ca")
		}
		return nil, nil, errors.New("-tls-cert, -tls-key and -tls-ca must be given together")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("TLS key pair: %w", err)
	}
	clients := x509.NewCertPool()
	if err := appendPEM(clients, "-tls-ca", caFile); err != nil {
		return nil, nil, err
	}
	peers := clients
	if peerCAFile != "" {
		peers = x509.NewCertPool()
		if err := appendPEM(peers, "-tls-peer-ca", peerCAFile); err != nil {
			return nil, nil, err
		}
		if err := appendPEM(clients, "-tls-peer-ca", peerCAFile); err != nil {
			return nil, nil, err
		}
		// The replica's certificate must come from the peer CA: one
		// that does not (the two CAs swapped, a client's certificate)
		// would start, fail every peer handshake and, in the replica,
		// turn off the check of peers' certificates (peerAuthorizer).
		if err := verifyOwn(cert, peers); err != nil {
			return nil, nil, fmt.Errorf("-tls-cert %s is not signed by the -tls-peer-ca CA (%s): %w", certFile, peerCAFile, err)
		}
	}
	server = &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    clients,
		MinVersion:   tls.VersionTLS13,
	}
	peer = &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      peers,
		MinVersion:   tls.VersionTLS13,
	}
	return server, peer, nil
}

// verifyOwn verifies cert (its leaf, the rest of its chain as
// intermediates) against roots, for any key usage.
func verifyOwn(cert tls.Certificate, roots *x509.CertPool) error {
	inter := x509.NewCertPool()
	var leaf *x509.Certificate
	for i, der := range cert.Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return err
		}
		if i == 0 {
			leaf = c
		} else {
			inter.AddCert(c)
		}
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// appendPEM adds the certificates of the PEM file to pool; flag names the
// setting in errors.
func appendPEM(pool *x509.CertPool, flag, file string) error {
	pem, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("%s: no PEM certificate in %s", flag, file)
	}
	return nil
}
