// Package clients runs the README's walkthrough the way users do, in
// every client: the CLI, the Go library, a client generated from the
// OpenAPI document, the Python and TypeScript packages (with their whole
// suites) and the unmodified E2B SDK, against one real hareboxd with real
// VMs. It is a package of its own so that it runs beside e2e's other
// tests rather than after them.
package clients

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testserver"
)

func TestWalkthrough(t *testing.T) {
	s := testserver.Prepare(t)
	dataDir, err := os.MkdirTemp("", "hbw")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	// Over HTTPS: every client (CLI, Python, TypeScript) trusts the
	// server's self-signed certificate through HAREBOX_CA.
	// Golden snapshots: the first create of each image boots, later ones
	// (the clients' suites make dozens) restore, as a server run so would.
	// The E2B listener too: the E2B SDK's suite runs against this server,
	// sharing its golden snapshots.
	e2bAddr := testserver.FreeAddr(t)
	srv := testserver.Start(t, s, dataDir, append([]string{"--tls-self-signed", "--golden-snapshots"}, e2bFlags(e2bAddr)...)...)
	defer func() { testserver.Finish(t, srv, dataDir) }()
	examples := filepath.Join(s.Root, "examples", "untrusted")

	t.Run("CLI", func(t *testing.T) {
		out := testserver.Run(t, srv, s, examples, 5*time.Minute, "bash", "walkthrough.sh")
		if !strings.Contains(out, testserver.JobOutput) || !strings.Contains(out, `"state": "deleted"`) {
			t.Fatalf("walkthrough output:\n%s", out)
		}
		if l := srv.Sandboxes(t, ""); len(l) != 0 {
			t.Fatalf("sandboxes left: %v", l)
		}
	})
	t.Run("Go", func(t *testing.T) {
		// The library form runs its own engine on its own data directory.
		dir, err := os.MkdirTemp("", "hbg")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		defer testserver.NoLeftovers(t, dir)
		out := testserver.Run(t, srv, s, s.Root, 5*time.Minute, "go", "run", "./examples/untrusted",
			"--data-dir", dir, "--image-dir", s.ImageDir, "--plugin", s.Plugin)
		if !strings.Contains(out, "0 "+testserver.JobOutput) {
			t.Fatalf("walkthrough output:\n%s", out)
		}
	})
	t.Run("GeneratedClient", func(t *testing.T) {
		// A client generated from the OpenAPI document by a maintained
		// generator (oapi-codegen, a tool of this module) compiles and runs
		// the walkthrough (e2e/testdata/genwalk).
		testserver.Run(t, srv, s, s.Root, 5*time.Minute, "go", "tool", "oapi-codegen", "-generate", "types,client", "-package", "gen",
			"-o", "e2e/testdata/genwalk/gen/client.gen.go", "api/openapi.yaml")
		out := testserver.Run(t, srv, s, s.Root, 10*time.Minute, "go", "run", "./e2e/testdata/genwalk")
		if !strings.HasPrefix(out, "0 "+testserver.JobOutput) {
			t.Fatalf("walkthrough on the generated client:\n%s", out)
		}
	})
	// The SDK suites cover every route; each also runs its walkthrough
	// (examples/untrusted/walkthrough.py and walkthrough.mjs) on the Debian
	// image. Their other tests use the minimal image to boot fast.
	t.Run("Python", func(t *testing.T) {
		// Debian's python3 has python3-pytest (make deps installs it); a
		// python3 earlier on PATH (pyenv, venv) may not.
		py := "/usr/bin/python3"
		if !testserver.FileExists(py) {
			py = "python3"
		}
		// The package as users get it: a wheel built from a copy of the
		// source (setuptools builds in place), installed into a fresh
		// directory, which the suite imports instead of the source tree.
		work := t.TempDir()
		if err := os.CopyFS(filepath.Join(work, "src"), os.DirFS(filepath.Join(s.Root, "sdk", "python"))); err != nil {
			t.Fatal(err)
		}
		testserver.Run(t, srv, s, work, 5*time.Minute, py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", "dist", "./src")
		wheels, _ := filepath.Glob(filepath.Join(work, "dist", "harebox-*-py3-none-any.whl"))
		if len(wheels) != 1 {
			t.Fatalf("built wheels: %v", wheels)
		}
		testserver.Run(t, srv, s, work, 5*time.Minute, py, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", "site", wheels[0])
		// (The stop/start test checks files on the Debian image, whose root
		// is on its disk.)
		out := testserver.Run(t, srv, s, work, 10*time.Minute, "env", "HAREBOX_TEST_IMAGE=minimal", "HAREBOX_TEST_DEFAULT_IMAGE_NAME=default",
			"HAREBOX_TEST_INSTALLED=1", "PYTHONPATH="+filepath.Join(work, "site"), "PIP_ROOT_USER_ACTION=ignore",
			py, "-m", "pytest", filepath.Join(s.Root, "sdk", "python"), "-q", "-p", "no:cacheprovider",
			// (The code interpreter's live tests need its image: TestCodeInterpreter runs them.)
			"--ignore", filepath.Join(s.Root, "sdk", "python", "tests", "test_code.py"))
		t.Log(testserver.LastLines(out, 3))
		if !strings.Contains(out, " passed") || strings.Contains(out, " failed") || strings.Contains(out, " skipped") {
			t.Fatalf("pytest:\n%s", out)
		}
	})
	t.Run("TypeScript", func(t *testing.T) {
		dir := filepath.Join(s.Root, "sdk", "typescript")
		testserver.NPMInstalled(t, srv, s, dir)
		// The package as users get it: packed, installed into a fresh
		// project (offline: make deps put undici in npm's cache), and the
		// walkthrough run from there, importing "harebox".
		work := t.TempDir()
		tgz := strings.TrimSpace(testserver.LastLines(testserver.Run(t, srv, s, dir, 5*time.Minute, "npm", "pack", "--pack-destination", work, "--loglevel=error"), 1))
		app := filepath.Join(work, "app")
		os.MkdirAll(app, 0o755)
		os.WriteFile(filepath.Join(app, "package.json"), []byte(`{"name": "walkthrough", "private": true, "type": "module"}`), 0o644)
		testserver.Run(t, srv, s, app, 5*time.Minute, "npm", "install", "--offline", "--no-audit", "--no-fund", "--loglevel=error", filepath.Join(work, tgz))
		src, err := os.ReadFile(filepath.Join(s.Root, "examples", "untrusted", "walkthrough.mjs"))
		if err != nil {
			t.Fatal(err)
		}
		walk := strings.Replace(string(src), `from "../../sdk/typescript/dist/index.js"`, `from "harebox"`, 1)
		if walk == string(src) {
			t.Fatal("walkthrough.mjs: its import of the client moved; update this test")
		}
		os.WriteFile(filepath.Join(app, "walkthrough.mjs"), []byte(walk), 0o644)
		if job, err := os.ReadFile(filepath.Join(s.Root, "examples", "untrusted", "job.py")); err != nil || os.WriteFile(filepath.Join(app, "job.py"), job, 0o644) != nil {
			t.Fatal("job.py:", err)
		}
		out := testserver.Run(t, srv, s, dir, 10*time.Minute, "env", "HAREBOX_TEST_IMAGE=minimal", "HAREBOX_TEST_WALKTHROUGH="+filepath.Join(app, "walkthrough.mjs"), "npm", "test")
		t.Log(testserver.LastLines(out, 12))
		testserver.LogSlowTAP(t, out)
		if !strings.Contains(out, "# fail 0") || strings.Contains(out, "# pass 0") {
			t.Fatalf("npm test:\n%s", out)
		}
	})
	t.Run("E2BSDK", func(t *testing.T) { e2bSDK(t, s, srv, e2bAddr) })
	t.Run("GracefulRestart", func(t *testing.T) {
		out := testserver.Run(t, srv, s, s.Root, 5*time.Minute, "harebox", "new", "--image", "minimal", "--label", "e2e=restart")
		var box struct{ ID string }
		if err := json.Unmarshal([]byte(out), &box); err != nil || box.ID == "" {
			t.Fatalf("new: %v\n%s", err, out)
		}
		testserver.Run(t, srv, s, s.Root, time.Minute, "harebox", "exec", box.ID, "-c", "echo survived > /tmp/mark")
		// The guest got its address from the server's pool, from the host.
		if out := testserver.Run(t, srv, s, s.Root, time.Minute, "harebox", "exec", box.ID, "-c", "ip -4 -o addr show eth0"); !strings.Contains(out, srv.Pool) {
			t.Fatalf("guest address: %q", out)
		}
		policy := `{"default_outbound":"deny","outbound":[{"action":"allow","protocol":"tcp","ports":"443","hosts":["pypi.org"]}]}`
		testserver.Run(t, srv, s, s.Root, time.Minute, "harebox", "firewall", "set", box.ID, "--body", policy)
		srv.Stop(t)
		srv = testserver.Start(t, s, dataDir, "--tls-self-signed", "--golden-snapshots") // the deferred stop stops this one
		out = testserver.Run(t, srv, s, s.Root, time.Minute, "harebox", "exec", box.ID, "--", "cat", "/tmp/mark")
		if out != "survived\n" {
			t.Fatalf("after a restart: %q", out)
		}
		out = testserver.Run(t, srv, s, s.Root, time.Minute, "harebox", "firewall", "get", box.ID)
		if !strings.Contains(out, `"pypi.org"`) || !strings.Contains(out, `"deny"`) {
			t.Fatalf("policy after a restart: %s", out)
		}

		// The CLI's contract, on the same sandbox.
		cli := func(stdin string, args ...string) (string, string, int) {
			cmd := exec.Command(filepath.Join(s.Bin, "harebox"), args...)
			cmd.Env, cmd.Stdin = srv.Env(s), strings.NewReader(stdin)
			var o, e bytes.Buffer
			cmd.Stdout, cmd.Stderr = &o, &e
			cmd.Run()
			return o.String(), e.String(), cmd.ProcessState.ExitCode()
		}
		if o, _, code := cli("", "exec", box.ID, "--", "sh", "-c", "echo out; exit 3"); code != 3 || o != "out\n" {
			t.Errorf("exec exit code: %d %q, want 3", code, o)
		}
		if o, _, code := cli("piped\n", "exec", box.ID, "--", "cat"); code != 0 || o != "piped\n" {
			t.Errorf("exec stdin: %d %q", code, o)
		}
		if _, e, code := cli("", "exec", box.ID, "--timeout", "1", "--", "sleep", "30"); code != 124 || !strings.Contains(e, "timed out") {
			t.Errorf("exec timeout: %d %q", code, e)
		}
		if o, _, code := cli("", "--output", "table", "list", "--label", "e2e=restart"); code != 0 || !strings.HasPrefix(o, "ID ") || !strings.Contains(o, box.ID) {
			t.Errorf("table: %d %q", code, o)
		}
		for _, c := range []struct {
			args []string
			code int
		}{
			{[]string{"get", "sbx_01m8ka6npde8xkm1x1xncdtwqe"}, 1}, // API error
			{[]string{"new", "--size", "huge"}, 1},                 // API validation error
			{[]string{"exec", box.ID}, 2},                          // usage: no command
			{[]string{"frobnicate"}, 2},                            // usage: unknown command
			{[]string{"new", "--bogus"}, 2},                        // usage: unknown flag
		} {
			_, e, code := cli("", c.args...)
			if code != c.code || strings.Count(strings.TrimSpace(e), "\n") != 0 || !strings.HasPrefix(e, "harebox") {
				t.Errorf("harebox %v: exit %d, stderr %q; want exit %d and one line", c.args, code, e, c.code)
			}
		}
		testserver.Run(t, srv, s, s.Root, time.Minute, "harebox", "delete", box.ID)
	})
}
