package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quorumlock/quorumlock"
	"github.com/quorumlock/quorumlock/internal/proctest"
)

// TestReviewHTLSPeerCA runs lockd with -tls-peer-ca end to end: the
// replicas' certificates come from a peer CA, the clients' from the client
// CA (-tls-ca). lockctl, with a client certificate and -tls-ca PEERCA (as
// the README says), works; a lockd whose own certificate comes from the
// client CA, started as member 3 on member 3's address while the real one
// is down (with -tls-ca PEERCA, so that its peer side verifies the
// members' servers: lockd refuses -tls-peer-ca with a certificate that CA
// did not sign), has its peer streams refused by the real members (their
// Authorize check, which the refusal in their logs shows: with it off the
// test fails), never learns of a leader, and the cluster keeps serving.
// The members cannot reach it either: its server certificate is not from
// the peer CA.
func TestReviewHTLSPeerCA(t *testing.T) {
	if testing.Short() {
		t.Skip("starts lockd processes")
	}
	dir := t.TempDir()
	peerCA, clientCA := proctest.NewPKI(t, dir, "peer"), proctest.NewPKI(t, dir, "client")
	certs := map[uint64][2]string{}
	for id := uint64(1); id <= 3; id++ {
		cert, key := peerCA.Issue(t, fmt.Sprintf("replica-%d", id))
		certs[id] = [2]string{cert, key}
	}
	impCert, impKey := clientCA.Issue(t, "impostor")
	impData := filepath.Join(dir, "impostor-data")
	impostor := false

	harness := clientCA.ClientTLS(t, "harness")
	harness.RootCAs = peerCA.Pool()
	c := proctest.NewCluster(t, lockdBin, proctest.Options{
		Args: func(id uint64) []string {
			cert, key := certs[id][0], certs[id][1]
			if impostor && id == 3 {
				// Trusting the peer CA, so that it reaches the members'
				// servers; a later -data wins: it starts from nothing.
				return []string{"-tls-cert", impCert, "-tls-key", impKey, "-tls-ca", peerCA.CAFile, "-data", impData}
			}
			return []string{"-tls-cert", cert, "-tls-key", key, "-tls-ca", clientCA.CAFile, "-tls-peer-ca", peerCA.CAFile}
		},
		ClientTLS: harness,
	})
	c.WaitLeader(10 * time.Second)

	opCert, opKey := clientCA.Issue(t, "operator")
	lc := newCtl(t, c, "-tls-cert", opCert, "-tls-key", opKey, "-tls-ca", peerCA.CAFile)
	lc.ok("status")
	out := lc.ok("acquire", "peer-ca", "--", "sh", "-c", "echo $QUORUMLOCK_TOKEN")
	if _, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64); err != nil {
		t.Fatalf("acquire printed %q", out)
	}
	// Trusting the client CA for the servers is the mistake the README
	// warns about: the servers' certificates come from the peer CA.
	wrong := newCtl(t, c, "-timeout", "1s", "-tls-cert", opCert, "-tls-key", opKey, "-tls-ca", clientCA.CAFile)
	if _, errs, code := wrong.run("status"); code != 1 || !strings.Contains(errs, "lockctl status:") {
		t.Errorf("lockctl -tls-ca CLIENTCA status: exit %d, stderr %q", code, errs)
	}

	// The impostor: member 3's ID and address, a client CA certificate.
	c.Kill(3)
	impostor = true
	c.Start(3)
	deadline := time.Now().Add(20 * time.Second)
	// The log line quotes the certificate's name escaped, as JSON.
	for _, id := range []uint64{1, 2} {
		for {
			b, err := os.ReadFile(c.LogFile(id))
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(b, []byte("not authorized as member 3")) && bytes.Contains(b, []byte(`certificate \"impostor\" is not from the peer CA`)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("replica %d did not refuse the impostor's peer stream within 20s", id)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// The real member 3 (a peer CA certificate) was never refused.
	for _, id := range []uint64{1, 2} {
		if b, _ := os.ReadFile(c.LogFile(id)); bytes.Contains(b, []byte(`\"replica-3\" is not from`)) {
			t.Errorf("replica %d refused the real member 3", id)
		}
	}

	// The impostor has been refused by both members: it knows no leader
	// and has committed only its own start-up entries, short of the
	// leader's commit index. Its server certificate is from the client
	// CA and it wants client certificates of the peer CA (its -tls-ca).
	lead := c.WaitLeader(10 * time.Second)
	if lead == 3 {
		t.Fatal("the impostor leads")
	}
	st := c.Status(time.Second)[lead]
	impTLS := peerCA.ClientTLS(t, "asker")
	impTLS.RootCAs = clientCA.Pool()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl, err := quorumlock.Dial(ctx, []string{c.Addr(3)}, quorumlock.WithTLS(impTLS))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	is := cl.Status(ctx)[0]
	if is.Err != nil {
		t.Fatalf("impostor status: %v", is.Err)
	}
	if is.ID != 3 || is.Leader != 0 || is.Commit >= st.Commit {
		t.Errorf("impostor status %+v; leader %d at %+v", is.Status, lead, st)
	}

	// The cluster serves on without member 3.
	lc2 := newCtl(t, c, "-tls-cert", opCert, "-tls-key", opKey, "-tls-ca", peerCA.CAFile)
	lc2.flags[1] = strings.Join(c.Addrs(1, 2), ",")
	out = lc2.ok("acquire", "peer-ca", "--", "sh", "-c", "echo $QUORUMLOCK_TOKEN")
	if _, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64); err != nil {
		t.Fatalf("acquire with the impostor up printed %q", out)
	}
}

// TestReviewHTLSPeerCAMixups: TLS flags given wrongly around -tls-peer-ca
// are usage errors (exit status 2, a message naming the flag), found
// before lockd serves.
func TestReviewHTLSPeerCAMixups(t *testing.T) {
	dir := t.TempDir()
	peerCA, clientCA := proctest.NewPKI(t, dir, "peer"), proctest.NewPKI(t, dir, "client")
	cert, key := peerCA.Issue(t, "replica-1")
	clientCert, clientKey := clientCA.Issue(t, "client")
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		flags []string
		want  string
	}{
		{"peer CA alone", []string{"-tls-peer-ca", peerCA.CAFile}, "-tls-peer-ca needs -tls-cert, -tls-key and -tls-ca"},
		{"no -tls-ca", []string{"-tls-cert", cert, "-tls-key", key, "-tls-peer-ca", peerCA.CAFile}, "-tls-peer-ca needs -tls-cert, -tls-key and -tls-ca"},
		{"peer CA not PEM", []string{"-tls-cert", cert, "-tls-key", key, "-tls-ca", clientCA.CAFile, "-tls-peer-ca", notPEM}, "-tls-peer-ca"},
		{"peer CA missing", []string{"-tls-cert", cert, "-tls-key", key, "-tls-ca", clientCA.CAFile, "-tls-peer-ca", filepath.Join(dir, "nope.pem")}, "-tls-peer-ca"},
		// The two CAs swapped: the replica's certificate is not from
		// what it was told is the peer CA.
		{"CAs swapped", []string{"-tls-cert", cert, "-tls-key", key, "-tls-ca", peerCA.CAFile, "-tls-peer-ca", clientCA.CAFile}, "is not signed by the -tls-peer-ca CA"},
		// A client certificate as the replica's own.
		{"client certificate", []string{"-tls-cert", clientCert, "-tls-key", clientKey, "-tls-ca", clientCA.CAFile, "-tls-peer-ca", peerCA.CAFile}, "is not signed by the -tls-peer-ca CA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			l.Close()
			args := append([]string{"-id", "1", "-peers", "1=" + addr, "-data", filepath.Join(t.TempDir(), "d")}, tc.flags...)
			cmd := exec.CommandContext(ctx, lockdBin, args...)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			err = cmd.Run()
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				t.Fatal(err)
			}
			if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(errb.String(), tc.want) || out.Len() != 0 {
				t.Errorf("lockd %v: exit %d (want 2), stdout %q, stderr %q (want it to name %s)", tc.flags, code, out.String(), errb.String(), tc.want)
			}
		})
	}
}
