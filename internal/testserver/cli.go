package testserver

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/sandbox"
)

// StartNoVM starts hareboxd without a network or images: the tenancy and
// key routes boot no VM. hareboxd still needs its backend plugin to start.
func StartNoVM(t testing.TB, s Setup, dataDir string) *Server {
	t.Helper()
	return Launch(t, s, dataDir, "--image-dir", filepath.Join(dataDir, "no-images"), "--plugin", s.Plugin, "--network", "none")
}

// RunCLI runs harebox against srv with key ("" for the root key) and
// returns its stdout, stderr and exit code.
func RunCLI(t testing.TB, s Setup, srv *Server, key string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(s.Bin, "harebox"), args...)
	cmd.Env = srv.Env(s)
	if key != "" {
		cmd.Env = append(cmd.Env, "HAREBOX_API_KEY="+key)
	}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// CLI runs harebox against a hareboxd for one test; OK and Fails check a
// run the way every CLI contract test does.
type CLI struct {
	T   testing.TB
	S   Setup
	Srv *Server

	made []string
}

// StartTemp starts a server (Start, with extra) on a new data directory
// of its own (named with prefix); when the test ends, the server is
// finished (Finish: it must leave no VM) and the directory removed.
func StartTemp(t testing.TB, s Setup, prefix string, extra ...string) *Server {
	t.Helper()
	dataDir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dataDir) })
	srv := Start(t, s, dataDir, extra...)
	t.Cleanup(func() { Finish(t, srv, dataDir) })
	return srv
}

// StartCLI starts a server with StartTemp and returns a CLI on it. When
// the test ends, the sandboxes given to Made are deleted before the
// server is finished.
func StartCLI(t testing.TB, s Setup, prefix string, extra ...string) *CLI {
	t.Helper()
	c := &CLI{T: t, S: s, Srv: StartTemp(t, s, prefix, extra...)}
	t.Cleanup(func() {
		for _, id := range c.made {
			c.Run("", "delete", id)
		}
	})
	return c
}

// Made has sandbox id deleted when the test ends (StartCLI).
func (c *CLI) Made(id string) { c.made = append(c.made, id) }

// Run runs harebox with key ("" for the root key).
func (c *CLI) Run(key string, args ...string) (string, string, int) {
	c.T.Helper()
	return RunCLI(c.T, c.S, c.Srv, key, args...)
}

// OK runs harebox, wants exit 0 and nothing on stderr, and decodes its
// JSON output into out.
func (c *CLI) OK(key string, out any, args ...string) string {
	c.T.Helper()
	o, e, code := c.Run(key, args...)
	if code != 0 || e != "" {
		c.T.Fatalf("harebox %s: exit %d\nstdout: %s\nstderr: %s\nserver log:\n%s", strings.Join(args, " "), code, o, e, Tail(c.Srv.Log.String()))
	}
	if out != nil {
		if err := json.Unmarshal([]byte(o), out); err != nil {
			c.T.Fatalf("harebox %s: %v\n%s", strings.Join(args, " "), err, o)
		}
	}
	return o
}

// Fails runs harebox and wants exit code, one line on stderr that starts
// with "harebox" and contains want, and nothing on stdout.
func (c *CLI) Fails(key string, code int, want string, args ...string) string {
	c.T.Helper()
	o, e, got := c.Run(key, args...)
	if got != code || o != "" || strings.Count(strings.TrimSpace(e), "\n") != 0 || !strings.HasPrefix(e, "harebox") || !strings.Contains(e, want) {
		c.T.Errorf("harebox %s: exit %d, stdout %q, stderr %q; want exit %d and one line with %q", strings.Join(args, " "), got, o, e, code, want)
	}
	return e
}

// PrepareNoVM builds the binaries a hareboxd that boots no VM needs.
func PrepareNoVM(t testing.TB) Setup {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it); hareboxd needs its plugin to start")
	}
	s := Setup{Root: testimage.Root(t), Flags: []string{"--pool", "none"}}
	for _, name := range []string{"harebox", "hareboxd", "harebox-plugin-qemu"} {
		s.Bin = filepath.Dir(testimage.Binary(t, name))
	}
	s.Plugin = filepath.Join(s.Bin, "harebox-plugin-qemu")
	s.Hareboxd = filepath.Join(s.Bin, "hareboxd")
	return s
}

// WaitGolden waits until the server has a golden snapshot of each of
// images at the default size (a server started with --pool IMAGE:small=0
// makes them at its start), so that creates restore rather than boot.
func (c *CLI) WaitGolden(images ...string) {
	c.T.Helper()
	for deadline := time.Now().Add(10 * time.Minute); ; time.Sleep(time.Second) {
		var l struct{ Images []sandbox.Image }
		c.OK("", &l, "image", "list")
		ready := map[string]bool{}
		for _, img := range l.Images {
			for _, g := range img.Golden {
				if g.State == sandbox.GoldenFailed {
					c.T.Fatalf("the golden snapshot of %s failed:\n%s", img.Name, Tail(c.Srv.Log.String()))
				}
				if g.State == sandbox.GoldenReady && slices.Contains(images, img.Name) {
					ready[img.Name] = true
				}
			}
		}
		if len(ready) == len(images) {
			return
		}
		if time.Now().After(deadline) {
			c.T.Fatalf("golden snapshots after 10 minutes: %+v", l.Images)
		}
	}
}
