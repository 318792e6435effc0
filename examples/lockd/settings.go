package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// settings are lockd's flags, and the fields of its -config file.
type settings struct {
	ID            uint64   `json:"id"`
	Peers         peerList `json:"peers"`
	Data          string   `json:"data"`
	Listen        string   `json:"listen"`
	ClusterName   string   `json:"cluster_name"`
	TTL           duration `json:"ttl"`
	Tick          duration `json:"tick"`
	ElectionTicks int      `json:"election_ticks"`
	TLSCert       string   `json:"tls_cert"`
	TLSKey        string   `json:"tls_key"`
	TLSCA         string   `json:"tls_ca"`
	TLSPeerCA     string   `json:"tls_peer_ca"`
	LogLevel      string   `json:"log_level"`
	Metrics       string   `json:"metrics"`
}

// defaults are the library's defaults, spelled out so that -help shows them.
func defaults() settings {
	return settings{
		ClusterName:   "quorumlock",
		TTL:           duration(10 * time.Second),
		Tick:          duration(100 * time.Millisecond),
		ElectionTicks: 10,
		LogLevel:      "info",
	}
}

func (s *settings) register(fs *flag.FlagSet) {
	fs.Uint64Var(&s.ID, "id", s.ID, "this replica's member `ID` (a key of -peers); required")
	fs.Var(&s.Peers, "peers", "`ID=HOST:PORT,...` of every member, this one included; the same on every replica; required")
	fs.StringVar(&s.Data, "data", s.Data, "data `directory` (the raft log); created if missing; required")
	fs.StringVar(&s.Listen, "listen", s.Listen, "`address` to listen on (default: this replica's address in -peers)")
	fs.StringVar(&s.ClusterName, "cluster-name", s.ClusterName, "cluster `name`, checked in the peer handshake and the data directory")
	fs.Var(&s.TTL, "ttl", "default session `TTL`, a duration such as 10s")
	fs.Var(&s.Tick, "tick", "raft tick `interval`")
	fs.IntVar(&s.ElectionTicks, "election-ticks", s.ElectionTicks, "raft election timeout in `ticks`; election timeout must stay below ttl/2")
	fs.StringVar(&s.TLSCert, "tls-cert", s.TLSCert, "PEM certificate `file` of this replica, for mutual TLS with peers and clients")
	fs.StringVar(&s.TLSKey, "tls-key", s.TLSKey, "PEM private key `file` of -tls-cert")
	fs.StringVar(&s.TLSCA, "tls-ca", s.TLSCA, "PEM `file` of the CA that signs peer and client certificates")
	fs.StringVar(&s.TLSPeerCA, "tls-peer-ca", s.TLSPeerCA, "PEM `file` of a separate CA for the replicas' certificates (then -tls-ca signs only clients'); optional")
	fs.StringVar(&s.LogLevel, "log-level", s.LogLevel, "log `level`: debug, info, warn, error")
	fs.StringVar(&s.Metrics, "metrics", s.Metrics, "`address` to serve Prometheus metrics on, at /metrics (default: none)")
}

// parseSettings parses args over the defaults and, with -config, over the
// file's settings: defaults < file < flags given on the command line.
func parseSettings(args []string, stderr io.Writer) (settings, error) {
	s := defaults()
	var configFile string
	fs := flag.NewFlagSet("lockd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&configFile, "config", "", "JSON `file` of settings (keys: the flag names with _ for -); flags override it")
	s.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: lockd -id N -peers ID=HOST:PORT,... -data DIR [flags]")
		fmt.Fprintln(stderr, "       lockd -config FILE [flags]")
		fmt.Fprintln(stderr, "\nRuns one quorumlock replica. Prints \"lockd ready id=N addr=ADDR\" once serving; stops on SIGTERM or SIGINT.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return settings{}, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return settings{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if configFile == "" {
		return s, nil
	}
	f := defaults()
	if err := f.load(configFile); err != nil {
		return settings{}, err
	}
	// Re-apply the flags that were given on top of the file.
	over := flag.NewFlagSet("lockd", flag.ContinueOnError)
	f.register(over)
	var err error
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name != "config" && err == nil {
			err = over.Set(fl.Name, fl.Value.String())
		}
	})
	return f, err
}

func (s *settings) load(file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("-config: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(s); err != nil {
		return fmt.Errorf("-config %s: %w", file, err)
	}
	// Decode reads one value: anything after it is a mistake too.
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("-config %s: unexpected data after the settings object", file)
	}
	return nil
}

// peerList is the member map: "1=host:port,2=host:port" as a flag; that
// string or an object {"1": "host:port"} in the config file.
type peerList map[uint64]string

func (p *peerList) String() string {
	if p == nil || len(*p) == 0 {
		return ""
	}
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(*p)) {
		parts = append(parts, fmt.Sprintf("%d=%s", id, (*p)[id]))
	}
	return strings.Join(parts, ",")
}

func (p *peerList) Set(v string) error {
	m := make(peerList)
	for part := range strings.SplitSeq(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		idStr, addr, ok := strings.Cut(part, "=")
		if !ok || addr == "" {
			return fmt.Errorf("peer %q: want ID=HOST:PORT", part)
		}
		if err := m.add(idStr, addr); err != nil {
			return err
		}
	}
	if len(m) == 0 {
		return errors.New("no peers")
	}
	*p = m
	return nil
}

func (p peerList) add(idStr, addr string) error {
	id, err := strconv.ParseUint(strings.TrimSpace(idStr), 10, 64)
	if err != nil || id == 0 {
		return fmt.Errorf("peer ID %q: want a positive integer", idStr)
	}
	if _, dup := p[id]; dup {
		return fmt.Errorf("peer %d given twice", id)
	}
	p[id] = strings.TrimSpace(addr)
	return nil
}

func (p *peerList) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		return p.Set(s)
	}
	var obj map[string]string
	if err := json.Unmarshal(b, &obj); err != nil {
		return errors.New(`peers: want {"ID": "HOST:PORT", ...} or "ID=HOST:PORT,..."`)
	}
	m := make(peerList)
	for id, addr := range obj {
		if err := m.add(id, addr); err != nil {
			return err
		}
	}
	*p = m
	return nil
}

// duration is a time.Duration flag that reads "250ms" in JSON too.
type duration time.Duration

func (d *duration) d() time.Duration { return time.Duration(*d) }

func (d *duration) String() string { return time.Duration(*d).String() }

func (d *duration) Set(v string) error {
	x, err := time.ParseDuration(v)
	if err != nil {
		return err
	}
	*d = duration(x)
	return nil
}

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string such as \"2s\": %w", err)
	}
	return d.Set(s)
}
