// Package console tests the web console in a real browser: Debian's
// Chromium driven by Playwright (console/web/test), against a real
// hareboxd with real VMs.
package console

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testserver"
)

// TestConsoleInBrowser signs in, creates a sandbox and watches it run,
// runs a command, uploads and downloads a file, sets a firewall policy
// with a mistake, makes a scoped key and signs in with it, revokes it and
// watches the revoke in the audit log, with sandbox-controlled names that
// are markup everywhere; axe-core checks each page (console/web/test/
// console.test.mjs says what each step checks). Screenshots of each page
// are kept in HAREBOX_CONSOLE_SCREENSHOTS (default .cache/console).
func TestConsoleInBrowser(t *testing.T) {
	s := testserver.Prepare(t)
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (make deps installs it)")
	}
	web := filepath.Join(s.Root, "console", "web")
	if !testserver.FileExists(filepath.Join(web, "node_modules", "playwright-core")) {
		t.Skip("the console's test tools are not installed (make deps installs them)")
	}
	shots := os.Getenv("HAREBOX_CONSOLE_SCREENSHOTS")
	if shots == "" {
		shots = filepath.Join(s.Root, ".cache", "console")
	}
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	// An ingress, so a port can be published from the sandbox's page;
	// samples every second, so its charts have some; golden snapshots,
	// which the images page shows.
	c := testserver.StartCLI(t, s, "hbcon", "--ingress-listen", testserver.FreeAddr(t), "--metrics-interval", "1s", "--golden-snapshots")
	// A sandbox in the default project, which the scoped key (project
	// web) must not see.
	c.OK("", nil, "project", "create", "web")
	var hidden struct{ ID string }
	c.OK("", &hidden, "new", "--image", "minimal", "--name", "hidden-one", "--output", "json")
	c.Made(hidden.ID)
	// A second server over HTTPS (its own self-signed certificate), for
	// the sign-in's Secure cookie in the browser.
	tls := testserver.StartTemp(t, s, "hbcontls", "--tls-self-signed")

	cmd := exec.Command("node", "--test", "--test-reporter=spec", "test/console.test.mjs")
	cmd.Dir = web
	cmd.Env = append(os.Environ(), "HAREBOX_URL="+c.Srv.URL, "HAREBOX_ROOT_KEY="+c.Srv.Key, "HAREBOX_CHROMIUM="+chromium,
		"HAREBOX_CONSOLE_SCREENSHOTS="+shots, "HAREBOX_HIDDEN_SANDBOX="+hidden.ID,
		"HAREBOX_TLS_URL="+tls.URL, "HAREBOX_TLS_ROOT_KEY="+tls.Key, "HAREBOX_TLS_CERT="+tls.CA)
	done := make(chan struct{})
	var out []byte
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(8 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("the browser test took over 8 minutes:\n%s", out)
	}
	// Whatever the browser made, deleted when the test ends.
	for _, b := range c.Srv.Sandboxes(t, "") {
		if id, _ := b["id"].(string); id != hidden.ID {
			c.Made(id)
		}
	}
	if err != nil {
		t.Fatalf("the browser test failed: %v\n%s\nserver log:\n%s", err, out, testserver.Tail(c.Srv.Log.String()))
	}
	t.Logf("%s", testserver.LastLines(string(out), 30))
}
