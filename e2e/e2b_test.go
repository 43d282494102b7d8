package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testserver"
)

// TestE2BSDK runs the unmodified E2B SDK from npm, at the two pinned
// versions (e2e/e2bsdk/package.json), against hareboxd's E2B listener on
// real VMs: its suite (e2e/e2bsdk/compat.test.mjs) uses only the SDK's
// public API, configured as a user would, with the three variables, the
// key a HareBox key in E2B's form.
func TestE2BSDK(t *testing.T) {
	s := testserver.Prepare(t)
	dataDir, err := os.MkdirTemp("", "hbe2b")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	addr := testserver.FreeAddr(t)
	// E2B's "base" is the minimal image here, to boot fast; golden
	// snapshots on, as a server runs by default.
	srv := testserver.Start(t, s, dataDir, "--golden-snapshots", "--e2b-listen", addr, "--e2b-templates", "base=minimal,full=default",
		"--e2b-domain", "e2b.test")
	defer func() { testserver.Finish(t, srv, dataDir) }()

	st, key := srv.Call(t, "POST", "/v1/keys", srv.Key, map[string]any{"format": "e2b"})
	secret, _ := key["secret"].(string)
	if st != 201 || !regexp.MustCompile(`^e2b_[0-9a-f]{96}$`).MatchString(secret) {
		t.Fatalf("an E2B-form key: %d %v", st, key)
	}
	// A key that sees and makes only sandboxes labelled team=a.
	st, scoped := srv.Call(t, "POST", "/v1/keys", srv.Key, map[string]any{"format": "e2b", "scope": map[string]any{"labels": map[string]string{"team": "a"}}})
	scopedSecret, _ := scoped["secret"].(string)
	if st != 201 || scopedSecret == "" {
		t.Fatalf("a scoped key: %d %v", st, scoped)
	}
	dir := filepath.Join(s.Root, "e2e", "e2bsdk")
	if !testserver.FileExists(filepath.Join(dir, "node_modules")) {
		testserver.Run(t, srv, s, dir, 5*time.Minute, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	}
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
			if !strings.Contains(out, "# fail 0") || strings.Contains(out, "# pass 0") {
				t.Fatalf("node --test:\n%s", out)
			}
		})
	}
	if l := srv.Sandboxes(t, ""); len(l) != 0 {
		t.Errorf("sandboxes left: %v", l)
	}
}
