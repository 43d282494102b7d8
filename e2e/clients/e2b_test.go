package clients

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testserver"
)

// e2bSDK runs the unmodified E2B SDK from npm, at the two pinned
// versions (e2e/e2bsdk/package.json), against the E2B listener at addr of
// srv (TestWalkthrough's server, whose golden snapshots it shares: its
// flags are e2bFlags) on real VMs: its suite (e2e/e2bsdk/compat.test.mjs)
// uses only the SDK's public API, configured as a user would, with the
// three variables, the key a HareBox key in E2B's form.
func e2bSDK(t *testing.T, s testserver.Setup, srv *testserver.Server, addr string) {
	secret := srv.E2BKey(t)
	// A key that sees and makes only sandboxes labelled team=a.
	st, scoped := srv.Call(t, "POST", "/v1/keys", srv.Key, map[string]any{"format": "e2b", "scope": map[string]any{"labels": map[string]string{"team": "a"}}})
	scopedSecret, _ := scoped["secret"].(string)
	if st != 201 || scopedSecret == "" {
		t.Fatalf("a scoped key: %d %v", st, scoped)
	}
	dir := filepath.Join(s.Root, "e2e", "e2bsdk")
	testserver.NPMInstalled(t, srv, s, dir)
	// The newest runs the whole suite; 2.50 (which creates and connects
	// on E2B's v1 paths, and is otherwise the same client of envd) the
	// tests of the control plane, and of files to see its sandboxes work.
	for _, c := range []struct{ sdk, only string }{
		{"e2b-2.51", ""},
		{"e2b-2.50", "^(create, info|files: text|a timeout|bad input|a scoped key)"},
	} {
		t.Run(c.sdk, func(t *testing.T) {
			args := []string{"E2B_SDK=" + c.sdk, "E2B_API_URL=http://" + addr, "E2B_SANDBOX_URL=http://" + addr, "E2B_API_KEY=" + secret,
				"E2B_SCOPED_KEY=" + scopedSecret, "E2B_TEST_DOMAIN=e2b.test", "node", "--test", "--test-reporter=tap"}
			if c.only != "" {
				args = append(args, "--test-name-pattern="+c.only)
			}
			out := testserver.Run(t, srv, s, dir, 10*time.Minute, "env", append(args, "compat.test.mjs")...)
			t.Log(testserver.LastLines(out, 10))
			testserver.LogSlowTAP(t, out)
			if !strings.Contains(out, "# fail 0") || strings.Contains(out, "# pass 0") {
				t.Fatalf("node --test:\n%s", out)
			}
		})
	}
	if l := srv.Sandboxes(t, ""); len(l) != 0 {
		t.Errorf("sandboxes left: %v", l)
	}
}

// e2bFlags serve the E2B listener at addr: E2B's "base" is the minimal
// image (fast to restore), "full" the Debian one (its /bin/bash is what
// the SDK's commands and terminals run under). Files are limited to 32
// MiB, so that the suite can send one over the limit.
func e2bFlags(addr string) []string {
	return []string{"--e2b-listen", addr, "--e2b-templates", "base=minimal,full=default", "--e2b-domain", "e2b.test", "--max-file-bytes", "33554432"}
}
