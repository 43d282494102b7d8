// Package docs runs the examples of the README and docs/ as a user who
// pastes them would, against servers with real VMs: an example that
// stops working fails make test.
package docs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/doccmds"
	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/sandbox"
)

// TestExamples runs every shell, Python, TypeScript and JavaScript
// example of the README and docs/ not marked "<!-- not run: REASON -->" (internal/doccmds
// TestBlocks holds every block to that). A page's shell blocks run in
// order in one bash (set -euo pipefail), so that a block uses what an
// earlier one set, on a new server of the page's own; each Python,
// TypeScript and JavaScript block is a program of its own, on a new
// server too. Pages run two at a time, each on servers of its own. They
// run in a working directory of the page's, with examples/untrusted's job.py
// (the walkthrough's), HAREBOX_URL, HAREBOX_API_KEY, harebox on PATH, and
// DATA_DIR the server's data directory. Every server has an ingress on a
// free address.
func TestExamples(t *testing.T) {
	s := testserver.Prepare(t)
	testimage.Image(t, "code-interpreter")
	blocks, err := doccmds.Blocks(s.Root)
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string][]doccmds.Block{}
	var order []string
	for _, b := range blocks {
		if b.NotRun != "" || (b.Lang != "sh" && b.Lang != "python" && b.Lang != "ts" && b.Lang != "js") {
			continue
		}
		if pages[b.File] == nil {
			order = append(order, b.File)
		}
		pages[b.File] = append(pages[b.File], b)
	}
	if len(order) < 10 {
		t.Fatalf("%d pages with examples to run: the scan is broken", len(order))
	}
	// The servers share golden snapshots (make test's, or the test's
	// own), made before the examples run: a create in an example
	// restores, as users' creates after an image's first do.
	if os.Getenv("HAREBOX_TEST_GOLDEN_DIR") == "" {
		gold := t.TempDir()
		s.Flags = []string{"--golden-dir", gold, "--golden-key", filepath.Join(gold, "golden.key")}
	}
	warm(t, s, "default", "code-interpreter")
	for _, page := range order {
		t.Run(strings.TrimSuffix(filepath.Base(page), ".md"), func(t *testing.T) {
			// Two pages at a time (go test's -parallel, the cores): each
			// waits on its server and VMs much of its time.
			t.Parallel()
			work := t.TempDir()
			testserver.CopyFile(t, filepath.Join(s.Root, "examples", "untrusted", "job.py"), filepath.Join(work, "job.py"))
			// The packages a user's project would have installed:
			// "harebox" (sdk/typescript), and E2B's SDKs (e2e/e2bsdk's,
			// which make deps installs from npm).
			if !testserver.FileExists(filepath.Join(s.Root, "sdk", "typescript", "dist", "index.js")) {
				t.Fatal("sdk/typescript/dist is not built: make deps builds it (npm ci)")
			}
			os.MkdirAll(filepath.Join(work, "node_modules"), 0o755)
			for name, dir := range map[string]string{"harebox": "sdk/typescript", "e2b": "e2e/e2bsdk/node_modules/e2b", "@e2b": "e2e/e2bsdk/node_modules/@e2b"} {
				os.Symlink(filepath.Join(s.Root, dir), filepath.Join(work, "node_modules", name))
			}
			var script strings.Builder
			script.WriteString("set -euo pipefail\n")
			var sh []doccmds.Block
			for _, b := range pages[page] {
				if b.Lang == "sh" {
					fmt.Fprintf(&script, "echo '## %s' >&2\n%s", b.Where(), b.Code)
					sh = append(sh, b)
				}
			}
			if len(sh) > 0 {
				run(t, s, work, page, sh, "bash", "-c", script.String())
			}
			for i, b := range pages[page] {
				switch b.Lang {
				case "python":
					f := filepath.Join(work, fmt.Sprintf("example%d.py", i))
					os.WriteFile(f, []byte(b.Code), 0o644)
					run(t, s, work, page, []doccmds.Block{b}, "python3", f)
				case "ts", "js":
					f := filepath.Join(work, fmt.Sprintf("example%d.mjs", i))
					os.WriteFile(f, []byte(b.Code), 0o644)
					run(t, s, work, page, []doccmds.Block{b}, "node", f)
				}
			}
		})
	}
}

// pageFlags are the servers' flags a page's examples need: the address
// docs/e2b.md points E2B's SDK at.
var pageFlags = map[string][]string{
	"docs/e2b.md": {"--e2b-listen", "127.0.0.1:3000"},
}

// run runs a program of blocks of page, in dir, on a new server of its
// own (in a subtest: the server is stopped before the next program's
// starts, which may need its address), and deletes the sandboxes it left
// (in every account). A JavaScript block (E2B's SDK) gets E2B's three
// variables, pointing at the server's E2B listener with a key of its.
func run(t *testing.T, s testserver.Setup, dir, page string, blocks []doccmds.Block, name string, args ...string) {
	t.Helper()
	where := blocks[0].Where()
	if len(blocks) > 1 {
		where = fmt.Sprintf("%s's shell blocks (the last \"## \" line below names the one that failed)", page)
	}
	t.Run(fmt.Sprintf("line%d", blocks[0].Line), func(t *testing.T) {
		cli := testserver.StartCLI(t, s, "hbdoc", append([]string{"--ingress-listen", testserver.FreeAddr(t)}, pageFlags[page]...)...)
		srv := cli.Srv
		defer cleanUp(t, cli)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Env = append(srv.Env(s), "PYTHONPATH="+filepath.Join(s.Root, "sdk", "python"), "DATA_DIR="+srv.DataDir)
		if blocks[0].Lang == "js" {
			if len(pageFlags[page]) < 2 {
				t.Fatalf("%s: a JavaScript example on a page without an E2B listener", where)
			}
			e2b := "http://" + pageFlags[page][1]
			cmd.Env = append(cmd.Env, "E2B_API_URL="+e2b, "E2B_SANDBOX_URL="+e2b, "E2B_API_KEY="+srv.E2BKey(t))
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s\nserver log:\n%s", where, err, out, testserver.Tail(srv.Log.String()))
		}
		t.Logf("%s:\n%s", where, testserver.LastLines(string(out), 8))
	})
}

// cleanUp deletes the sandboxes of every account on cli's server.
func cleanUp(t *testing.T, cli *testserver.CLI) {
	var accounts struct{ Accounts []struct{ Name string } }
	cli.OK("", &accounts, "account", "list")
	for _, a := range accounts.Accounts {
		var l struct{ Sandboxes []sandbox.Sandbox }
		cli.OK("", &l, "list", "--account", a.Name)
		for _, sb := range l.Sandboxes {
			if sb.State != sandbox.StateDeleted {
				cli.OK("", nil, "delete", sb.ID)
			}
		}
	}
}

// warm has golden snapshots of images at the default size made: a
// server's pool of none of them makes them at its start.
func warm(t *testing.T, s testserver.Setup, images ...string) {
	var pool []string
	for _, img := range images {
		pool = append(pool, img+":small=0")
	}
	testserver.StartCLI(t, s, "hbdocw", "--pool", strings.Join(pool, ",")).WaitGolden(images...)
}
