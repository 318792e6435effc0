package main

import (
	"strings"
	"testing"
)

// Review AF: the README's exit statuses make a malformed flag a usage error
// (exit 2), as lockd does for the same TLS flags. An empty -endpoints (or
// LOCKCTL_ENDPOINTS) and -tls-cert without -tls-key (or the reverse) were
// reported as failures (exit 1), like an unreachable cluster; they are found
// before anything is dialled and now exit 2 with the usage.
func TestReviewAFFlagMisuseIsUsage(t *testing.T) {
	for what, flags := range map[string][]string{
		"empty -endpoints":        {"-endpoints", " , "},
		"-tls-cert without a key": {"-endpoints", "127.0.0.1:1", "-tls-cert", "cert.pem"},
		"-tls-key without a cert": {"-endpoints", "127.0.0.1:1", "-tls-key", "key.pem"},
	} {
		lc := &ctl{t: t, flags: append([]string{"-timeout", "500ms"}, flags...)}
		for _, args := range [][]string{{"status"}, {"locks"}, {"acquire", "x"}} {
			if _, errs, code := lc.run(args...); code != 2 || !strings.Contains(errs, "usage") {
				t.Errorf("lockctl %s %q: exit %d, stderr %q; want exit 2 with the usage", what, args, code, errs)
			}
		}
	}
}
