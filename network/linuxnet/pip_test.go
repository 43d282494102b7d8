package linuxnet

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/internal/testimage"
)

// TestVMDebian boots the Debian image once on a real tap and runs, one
// after the other on that VM (a Debian boot is half a minute and more
// under TCG), the tests that need its python3 and pip.
func TestVMDebian(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it)")
	}
	if os.Getenv("HAREBOX_TEST_DEFAULT_IMAGE") != "1" {
		t.Skip("needs the Debian image (python3, pip): set HAREBOX_TEST_DEFAULT_IMAGE=1 (make test does)")
	}
	img := testimage.Image(t, "default")
	e := newEnv(t)
	n := e.newNetworkWith("", nil) // real taps
	t.Cleanup(func() { n.Destroy(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	id := "sbx_deb" + suffix()
	att, err := n.Attach(ctx, id, mustPolicy(t, walkthrough))
	if err != nil {
		t.Fatal(err)
	}
	c := bootVM(t, ctx, id, img, att, 768)
	t.Run("PipInstall", func(t *testing.T) { vmPipInstall(t, ctx, e, n, id, c) })
	t.Run("Credentials", func(t *testing.T) { vmCredentials(t, ctx, e, n, id, c) })
}

// vmPipInstall proves the walkthrough's policy does what it is for: pip,
// as the unprivileged user with its default index, installs a wheel from
// the test internet's pypi.org (the index) and files.pythonhosted.org
// (the file), both over TLS. Under a deny-all policy the same install
// fails and neither host sees a connection.
func vmPipInstall(t *testing.T, ctx context.Context, e *env, n *Network, id string, c *client.Client) {
	wheel, sum := testWheel(t, "hbdemo", "1.0", "GREETING = 'installed from the test index'\n")
	file := "/packages/hb/demo/hbdemo-1.0-py3-none-any.whl"
	e.serve("files.pythonhosted.org", file, "application/octet-stream", wheel)
	e.serve("pypi.org", "/simple/hbdemo/", "text/html", []byte(fmt.Sprintf(
		`<!DOCTYPE html><html><body><a href="https://files.pythonhosted.org%s#sha256=%s">hbdemo-1.0-py3-none-any.whl</a></body></html>`, file, sum)))
	if err := n.SetPolicy(ctx, id, mustPolicy(t, walkthrough)); err != nil {
		t.Fatal(err)
	}
	// The test hosts' CA, trusted for this test only, the way the engine
	// installs a sandbox's own CA (a bundle and the variables naming it).
	const bundle = "/etc/harebox/test-ca.pem"
	if _, err := c.WriteFile(ctx, bundle, bytes.NewReader(e.pems), client.WriteOptions{Mode: 0o644, MakeParents: true}); err != nil {
		t.Fatal(err)
	}
	// The system pip, installing for the user (a venv's own pip would
	// first install itself, a minute and more under TCG; the image test
	// checks venv). --break-system-packages: Debian marks its Python as
	// externally managed (PEP 668).
	pip := func() (string, int) {
		t.Helper()
		start := time.Now()
		r, err := c.Exec(ctx, client.ExecRequest{
			Shell: "python3 -m pip install --user --break-system-packages --force-reinstall --disable-pip-version-check --no-cache-dir --retries 0 --timeout 10 hbdemo && " +
				"python3 -c 'import hbdemo; print(hbdemo.GREETING)'",
			User: "user", Cwd: "/home/user", Timeout: 4 * time.Minute,
			Env: map[string]string{"HOME": "/home/user", "SSL_CERT_FILE": bundle, "REQUESTS_CA_BUNDLE": bundle},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		out := string(r.Stdout) + string(r.Stderr)
		t.Logf("pip install (%v, exit %d):\n%s", time.Since(start).Round(time.Millisecond), r.ExitCode, out)
		return out, r.ExitCode
	}
	index, files := e.count("pypi.org"), e.count("files.pythonhosted.org")
	if out, code := pip(); code != 0 || !strings.Contains(out, "Successfully installed hbdemo-1.0") ||
		!strings.HasSuffix(out, "installed from the test index\n") {
		t.Fatalf("pip install under the walkthrough's policy failed")
	}
	if index.get() == 0 || files.get() == 0 {
		t.Fatalf("the index saw %d connections and the file host %d", index.get(), files.get())
	}

	// Deny all: the same install fails, and nothing reaches either host.
	if err := n.SetPolicy(ctx, id, mustPolicy(t, `{"default_outbound": "deny"}`)); err != nil {
		t.Fatal(err)
	}
	beforeIndex, beforeFiles := index.get(), files.get()
	if out, code := pip(); code == 0 || strings.Contains(out, "Successfully installed") {
		t.Fatalf("pip install succeeded under a deny-all policy")
	}
	if index.get() != beforeIndex || files.get() != beforeFiles {
		t.Errorf("under deny-all the index saw %d new connections and the file host %d", index.get()-beforeIndex, files.get()-beforeFiles)
	}
}

// testWheel builds a pure-Python wheel of one module and returns it with
// its SHA-256 (hex), as an index names it.
func testWheel(t *testing.T, name, version, module string) ([]byte, string) {
	t.Helper()
	info := name + "-" + version + ".dist-info/"
	files := []struct{ path, body string }{
		{name + "/__init__.py", module},
		{info + "METADATA", "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n"},
		{info + "WHEEL", "Wheel-Version: 1.0\nGenerator: harebox-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := z.Create(f.path)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f.body))
		h := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.path, base64.RawURLEncoding.EncodeToString(h[:]), len(f.body))
	}
	record.WriteString(info + "RECORD,,\n")
	w, err := z.Create(info + "RECORD")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(record.String()))
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), hex.EncodeToString(sum[:])
}
