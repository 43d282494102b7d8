// Package e2e runs HareBox the way users do: a real hareboxd with real
// VMs, driven by the CLI, the Go library, and the Python and TypeScript
// clients, each running the README's walkthrough.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testimage"
)

// server is a running hareboxd.
type server struct {
	cmd      *exec.Cmd
	url, key string
	dataDir  string
	log      *bytes.Buffer
	// ca is what clients trust an https server with (HAREBOX_CA), and
	// http a Go client that does.
	ca   string
	http *http.Client
	// table and pool are the firewall table and the address pool's first
	// three octets ("10.239.N.") of a server start started.
	table, pool string
}

type setup struct {
	root, bin, imageDir, plugin, hareboxd string
	// flags come first on every server's command line (its args can
	// override them).
	flags []string
}

func prepare(t *testing.T) setup {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it)")
	}
	if os.Getenv("HAREBOX_TEST_DEFAULT_IMAGE") != "1" {
		t.Skip("the walkthrough needs the Debian image: set HAREBOX_TEST_DEFAULT_IMAGE=1 (make test does)")
	}
	// Golden snapshots are on by default; a golden boot in the
	// background of every test would share the 2 cores with it, so only
	// the tests that ask for them get them.
	s := setup{root: testimage.Root(t), flags: []string{"--golden-snapshots=false"}}
	for _, name := range []string{"harebox", "hareboxd", "harebox-plugin-qemu"} {
		s.bin = filepath.Dir(testimage.Binary(t, name))
	}
	s.plugin = filepath.Join(s.bin, "harebox-plugin-qemu")
	s.hareboxd = filepath.Join(s.bin, "hareboxd")
	img := testimage.Image(t, "default")
	testimage.Image(t, "minimal")
	s.imageDir = filepath.Dir(img.Dir)
	return s
}

func start(t *testing.T, s setup, dataDir string, extra ...string) *server {
	t.Helper()
	return startEnv(t, s, dataDir, nil, extra...)
}

// startEnv is start with env added to hareboxd's environment (and only
// its: this process's stays as it is).
func startEnv(t *testing.T, s setup, dataDir string, env []string, extra ...string) *server {
	t.Helper()
	table, pool := networkOf(dataDir)
	srv := launchEnv(t, s, dataDir, env, append([]string{"--image-dir", s.imageDir, "--plugin", s.plugin, "--site", "fr-par-1", "--country", "FR",
		// The host firewall is on, in a table and pool of this data
		// directory's own (a restart on it keeps them).
		"--network", "linux", "--nft-table", table, "--address-pool", pool + "0/24"}, extra...)...)
	srv.table, srv.pool = table, pool
	return srv
}

var networks struct {
	sync.Mutex
	of map[string]int
}

// networkOf is the nftables table and the address pool's first three
// octets ("10.239.N.") of the servers on dataDir.
func networkOf(dataDir string) (table, pool string) {
	networks.Lock()
	defer networks.Unlock()
	if networks.of == nil {
		networks.of = map[string]int{}
	}
	n, ok := networks.of[dataDir]
	if !ok {
		n = len(networks.of)
		networks.of[dataDir] = n
	}
	return fmt.Sprintf("harebox_e2e_%d", n), fmt.Sprintf("10.239.%d.", n)
}

// finish stops a server that start started, checks that it left no VM
// or machine directory, and removes the test's firewall table (which
// outlives hareboxd on purpose: running VMs keep their rules).
func finish(t *testing.T, srv *server, dataDir string) {
	srv.stop(t)
	noLeftovers(t, dataDir)
	srv.dropTable(t)
}

// freeAddr is a loopback address for a server to listen on: a free port
// below the kernel's ephemeral range (32768 up, ip_local_port_range), so
// that no connection's own port takes it between this check and the
// server's bind.
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 200 {
		addr := fmt.Sprintf("127.0.0.1:%d", 20000+mathrand.IntN(12000))
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	t.Fatal("no free port below the ephemeral range")
	return ""
}

// dropTable removes the firewall table of a server that start started,
// and any tap left with an address of its pool (a test that failed after
// killing its server leaves its VMs' taps).
func (srv *server) dropTable(t *testing.T) {
	if srv.table == "" {
		return
	}
	if out, err := exec.Command("nft", "delete", "table", "inet", srv.table).CombinedOutput(); err != nil {
		t.Logf("nft delete table: %v %s", err, out)
	}
	out, _ := exec.Command("ip", "-o", "-4", "addr", "show").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 4 && strings.HasPrefix(f[1], "hb") && strings.HasPrefix(f[3], srv.pool) {
			t.Logf("removing a tap left in the server's pool: %s", f[1])
			exec.Command("ip", "link", "del", f[1]).Run()
		}
	}
}

// launch starts hareboxd on dataDir and a free loopback port with args,
// and waits until it answers.
func launch(t *testing.T, s setup, dataDir string, args ...string) *server {
	t.Helper()
	return launchEnv(t, s, dataDir, nil, args...)
}

func launchEnv(t *testing.T, s setup, dataDir string, env []string, args ...string) *server {
	t.Helper()
	addr := freeAddr(t)
	srv := &server{url: "http://" + addr, dataDir: dataDir, log: &bytes.Buffer{}, http: &http.Client{}}
	for i, a := range args {
		// An https server: clients trust its certificate as the CA.
		switch {
		case a == "--tls-self-signed":
			srv.ca = filepath.Join(dataDir, "tls", "cert.pem")
		case a == "--tls-cert" && i+1 < len(args):
			srv.ca = args[i+1]
		}
	}
	srv.cmd = exec.Command(s.hareboxd, slices.Concat([]string{"--data-dir", dataDir, "--listen", addr}, s.flags, args)...)
	if env != nil {
		srv.cmd.Env = append(os.Environ(), env...)
	}
	srv.cmd.Stdout, srv.cmd.Stderr = srv.log, srv.log
	if err := srv.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// (A loaded 2-core host, every test package at once, has taken
	// half a minute to start it.)
	started := time.Now()
	deadline := started.Add(60 * time.Second)
	for {
		if srv.ca != "" && srv.http.Transport == nil {
			// (The self-signed certificate exists once the server made it.)
			if cfg, err := apiclient.TLSConfig(srv.ca); err == nil {
				srv.url = "https://" + addr
				srv.http.Transport = &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
			}
		}
		resp, err := srv.http.Get(srv.url + "/health")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			srv.cmd.Process.Kill()
			srv.cmd.Wait()
			t.Fatalf("hareboxd did not answer within %v of its start (%s): %s", time.Since(started).Round(time.Millisecond), started.Format(time.RFC3339Nano), srv.log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	key, err := os.ReadFile(filepath.Join(dataDir, "root.key"))
	if err != nil {
		t.Fatal(err)
	}
	srv.key = strings.TrimSpace(string(key))
	return srv
}

// stop sends SIGTERM and waits: a graceful shutdown.
func (srv *server) stop(t *testing.T) {
	srv.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- srv.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("hareboxd exited with %v:\n%s", err, srv.log)
		}
	case <-time.After(60 * time.Second):
		srv.cmd.Process.Kill()
		t.Errorf("hareboxd did not stop within 60 s")
	}
}

func (srv *server) env(s setup) []string {
	env := append(os.Environ(), "HAREBOX_URL="+srv.url, "HAREBOX_API_KEY="+srv.key,
		"PATH="+s.bin+":"+os.Getenv("PATH"))
	if srv.ca != "" {
		env = append(env, "HAREBOX_CA="+srv.ca)
	}
	return env
}

// run runs a command with the server's environment and returns its output.
func run(t *testing.T, srv *server, s setup, dir string, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// exec resolves names with this process's PATH: use ours explicitly.
	if p := filepath.Join(s.bin, name); fileExists(p) {
		name = p
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, srv.env(s)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s\nserver log:\n%s", name, strings.Join(args, " "), err, out, tail(srv.log.String()))
	}
	return string(out)
}

func tail(s string) string {
	if len(s) > 3000 {
		return s[len(s)-3000:]
	}
	return s
}

func (srv *server) sandboxes(t *testing.T, state string) []map[string]any {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.url+"/v1/sandboxes?state="+state, nil)
	req.Header.Set("Authorization", "Bearer "+srv.key)
	resp, err := srv.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Sandboxes []map[string]any `json:"sandboxes"`
	}
	json.NewDecoder(resp.Body).Decode(&out)
	return out.Sandboxes
}

// noLeftovers fails if the server's data dir still has machines or VMs.
func noLeftovers(t *testing.T, dataDir string) {
	t.Helper()
	if ents, _ := os.ReadDir(filepath.Join(dataDir, "m")); len(ents) != 0 {
		t.Errorf("machine directories left: %v", ents)
	}
	for _, p := range procs.Naming(dataDir + "/") {
		if p.IsVMM() {
			syscall.Kill(p.PID, syscall.SIGKILL)
			t.Errorf("VM left running: %s", p)
		}
	}
}

const jobOutput = "hello from user (uid 1000)"

func TestWalkthrough(t *testing.T) {
	s := prepare(t)
	dataDir, err := os.MkdirTemp("", "hbw")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	// Over HTTPS: every client (CLI, Python, TypeScript) trusts the
	// server's self-signed certificate through HAREBOX_CA.
	// Golden snapshots: the first create of each image boots, later ones
	// (the clients' suites make dozens) restore, as a server run so would.
	srv := start(t, s, dataDir, "--tls-self-signed", "--golden-snapshots")
	defer func() { finish(t, srv, dataDir) }()
	examples := filepath.Join(s.root, "examples", "untrusted")

	t.Run("CLI", func(t *testing.T) {
		out := run(t, srv, s, examples, 5*time.Minute, "bash", "walkthrough.sh")
		if !strings.Contains(out, jobOutput) || !strings.Contains(out, `"state": "deleted"`) {
			t.Fatalf("walkthrough output:\n%s", out)
		}
		if l := srv.sandboxes(t, ""); len(l) != 0 {
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
		defer noLeftovers(t, dir)
		out := run(t, srv, s, s.root, 5*time.Minute, "go", "run", "./examples/untrusted",
			"--data-dir", dir, "--image-dir", s.imageDir, "--plugin", s.plugin)
		if !strings.Contains(out, "0 "+jobOutput) {
			t.Fatalf("walkthrough output:\n%s", out)
		}
	})
	t.Run("GeneratedClient", func(t *testing.T) {
		// A client generated from the OpenAPI document by a maintained
		// generator (oapi-codegen, a tool of this module) compiles and runs
		// the walkthrough (e2e/testdata/genwalk).
		run(t, srv, s, s.root, 5*time.Minute, "go", "tool", "oapi-codegen", "-generate", "types,client", "-package", "gen",
			"-o", "e2e/testdata/genwalk/gen/client.gen.go", "api/openapi.yaml")
		out := run(t, srv, s, s.root, 10*time.Minute, "go", "run", "./e2e/testdata/genwalk")
		if !strings.HasPrefix(out, "0 "+jobOutput) {
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
		if !fileExists(py) {
			py = "python3"
		}
		// The package as users get it: a wheel built from a copy of the
		// source (setuptools builds in place), installed into a fresh
		// directory, which the suite imports instead of the source tree.
		work := t.TempDir()
		if err := os.CopyFS(filepath.Join(work, "src"), os.DirFS(filepath.Join(s.root, "sdk", "python"))); err != nil {
			t.Fatal(err)
		}
		run(t, srv, s, work, 5*time.Minute, py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", "dist", "./src")
		wheels, _ := filepath.Glob(filepath.Join(work, "dist", "harebox-*-py3-none-any.whl"))
		if len(wheels) != 1 {
			t.Fatalf("built wheels: %v", wheels)
		}
		run(t, srv, s, work, 5*time.Minute, py, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", "site", wheels[0])
		// (The stop/start test checks files on the Debian image, whose root
		// is on its disk.)
		out := run(t, srv, s, work, 10*time.Minute, "env", "HAREBOX_TEST_IMAGE=minimal", "HAREBOX_TEST_DEFAULT_IMAGE_NAME=default",
			"HAREBOX_TEST_INSTALLED=1", "PYTHONPATH="+filepath.Join(work, "site"), "PIP_ROOT_USER_ACTION=ignore",
			py, "-m", "pytest", filepath.Join(s.root, "sdk", "python"), "-q", "-p", "no:cacheprovider")
		t.Log(lastLines(out, 3))
		if !strings.Contains(out, " passed") || strings.Contains(out, " failed") || strings.Contains(out, " skipped") {
			t.Fatalf("pytest:\n%s", out)
		}
	})
	t.Run("TypeScript", func(t *testing.T) {
		dir := filepath.Join(s.root, "sdk", "typescript")
		if !fileExists(filepath.Join(dir, "node_modules")) {
			run(t, srv, s, dir, 5*time.Minute, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		}
		// The package as users get it: packed, installed into a fresh
		// project (offline: make deps put undici in npm's cache), and the
		// walkthrough run from there, importing "harebox".
		work := t.TempDir()
		tgz := strings.TrimSpace(lastLines(run(t, srv, s, dir, 5*time.Minute, "npm", "pack", "--pack-destination", work, "--loglevel=error"), 1))
		app := filepath.Join(work, "app")
		os.MkdirAll(app, 0o755)
		os.WriteFile(filepath.Join(app, "package.json"), []byte(`{"name": "walkthrough", "private": true, "type": "module"}`), 0o644)
		run(t, srv, s, app, 5*time.Minute, "npm", "install", "--offline", "--no-audit", "--no-fund", "--loglevel=error", filepath.Join(work, tgz))
		src, err := os.ReadFile(filepath.Join(s.root, "examples", "untrusted", "walkthrough.mjs"))
		if err != nil {
			t.Fatal(err)
		}
		walk := strings.Replace(string(src), `from "../../sdk/typescript/dist/index.js"`, `from "harebox"`, 1)
		if walk == string(src) {
			t.Fatal("walkthrough.mjs: its import of the client moved; update this test")
		}
		os.WriteFile(filepath.Join(app, "walkthrough.mjs"), []byte(walk), 0o644)
		if job, err := os.ReadFile(filepath.Join(s.root, "examples", "untrusted", "job.py")); err != nil || os.WriteFile(filepath.Join(app, "job.py"), job, 0o644) != nil {
			t.Fatal("job.py:", err)
		}
		out := run(t, srv, s, dir, 10*time.Minute, "env", "HAREBOX_TEST_IMAGE=minimal", "HAREBOX_TEST_WALKTHROUGH="+filepath.Join(app, "walkthrough.mjs"), "npm", "test")
		t.Log(lastLines(out, 12))
		if !strings.Contains(out, "# fail 0") || strings.Contains(out, "# pass 0") {
			t.Fatalf("npm test:\n%s", out)
		}
	})
	t.Run("GracefulRestart", func(t *testing.T) {
		out := run(t, srv, s, s.root, 5*time.Minute, "harebox", "new", "--image", "minimal", "--label", "e2e=restart")
		var box struct{ ID string }
		if err := json.Unmarshal([]byte(out), &box); err != nil || box.ID == "" {
			t.Fatalf("new: %v\n%s", err, out)
		}
		run(t, srv, s, s.root, time.Minute, "harebox", "exec", box.ID, "-c", "echo survived > /tmp/mark")
		// The guest got its address from the server's pool, from the host.
		if out := run(t, srv, s, s.root, time.Minute, "harebox", "exec", box.ID, "-c", "ip -4 -o addr show eth0"); !strings.Contains(out, srv.pool) {
			t.Fatalf("guest address: %q", out)
		}
		policy := `{"default_outbound":"deny","outbound":[{"action":"allow","protocol":"tcp","ports":"443","hosts":["pypi.org"]}]}`
		run(t, srv, s, s.root, time.Minute, "harebox", "firewall", "set", box.ID, "--body", policy)
		srv.stop(t)
		srv = start(t, s, dataDir, "--tls-self-signed", "--golden-snapshots") // the deferred stop stops this one
		out = run(t, srv, s, s.root, time.Minute, "harebox", "exec", box.ID, "--", "cat", "/tmp/mark")
		if out != "survived\n" {
			t.Fatalf("after a restart: %q", out)
		}
		out = run(t, srv, s, s.root, time.Minute, "harebox", "firewall", "get", box.ID)
		if !strings.Contains(out, `"pypi.org"`) || !strings.Contains(out, `"deny"`) {
			t.Fatalf("policy after a restart: %s", out)
		}

		// The CLI's contract, on the same sandbox.
		cli := func(stdin string, args ...string) (string, string, int) {
			cmd := exec.Command(filepath.Join(s.bin, "harebox"), args...)
			cmd.Env, cmd.Stdin = srv.env(s), strings.NewReader(stdin)
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
		run(t, srv, s, s.root, time.Minute, "harebox", "delete", box.ID)
	})
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
