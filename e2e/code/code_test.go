// Package code runs the code interpreter on real VMs, through hareboxd
// and its clients (E2B's code-interpreter SDK among them): a package of
// its own, so that make test runs it beside the other long packages.
package code

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/sandbox"
)

// TestCodeInterpreter: the code-interpreter image on a real VM, through
// hareboxd, its REST API and the CLI: state across cells, charts,
// DataFrames, exceptions, timeouts, a kernel that dies, contexts, bash,
// a flood of output, a fork, and an interpreter replaced by root in the
// guest with one that lies.
func TestCodeInterpreter(t *testing.T) {
	t.Parallel()
	s := testserver.Prepare(t)
	testimage.Image(t, "code-interpreter")
	// The E2B listener too: E2B's code-interpreter SDK on the same sandbox.
	e2bAddr := testserver.FreeAddr(t)
	// Its golden snapshot first (the run's, if another test made it): the
	// sandbox restores with its kernel warm, as a user's after the image's
	// first create, instead of booting beside the golden boot.
	cli := testserver.StartCLI(t, s, "hbci", "--e2b-listen", e2bAddr, "--e2b-templates", "code-interpreter-v1=code-interpreter",
		"--pool", "code-interpreter:small=0")
	cli.WaitGolden("code-interpreter")
	srv := cli.Srv
	var box sandbox.Sandbox
	cli.OK("", &box, "new", "--image", "code-interpreter", "--ttl", "1200")
	cli.Made(box.ID)
	id := box.ID
	// run runs a cell through the CLI and returns the finished cell.
	run := func(wantExit int, args ...string) sandbox.CodeExecution {
		t.Helper()
		o, e, code := cli.Run("", append([]string{"run-code", id}, args...)...)
		var x sandbox.CodeExecution
		if code != wantExit || json.Unmarshal([]byte(o), &x) != nil {
			t.Fatalf("run-code %v: exit %d (want %d)\nstdout: %.2000s\nstderr: %.2000s", args, code, wantExit, o, e)
		}
		return x
	}
	mainText := func(x sandbox.CodeExecution) string {
		for _, r := range x.Results {
			if r.IsMainResult {
				return r.Text
			}
		}
		return ""
	}

	t.Run("State", func(t *testing.T) {
		a := run(0, "-c", "x = 41\nprint('set')")
		b := run(0, "-c", "x + 1")
		if a.Stdout != "set\n" || mainText(b) != "42" || b.ExecutionCount != a.ExecutionCount+1 || b.Status != "ok" {
			t.Fatalf("cells: %+v then %+v", a, b)
		}
	})
	t.Run("Chart", func(t *testing.T) {
		dir := t.TempDir()
		// (The table output: the CLI streams, prints the value, saves.)
		o, e, code := cli.Run("", "--output", "table", "run-code", id, "--save-results", dir, "-c",
			"import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(4, 3), dpi=100)\nplt.plot([1, 2, 3], [1, 4, 9])\nprint('plotted')")
		if code != 0 || !strings.Contains(o, "plotted") {
			t.Fatalf("chart: exit %d\n%s\n%s", code, o, e)
		}
		f, err := os.Open(filepath.Join(dir, "result-1.png"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cfg, err := png.DecodeConfig(f)
		if err != nil || cfg.Width < 100 || cfg.Height < 100 || cfg.Width > 1000 || cfg.Height > 1000 {
			t.Fatalf("the chart: %+v %v", cfg, err)
		}
		// The JSON answer reports the PNG's size.
		x := run(0, "-c", "fig = plt.figure(figsize=(4, 3), dpi=100)\nplt.plot([1, 2])\nplt.show()")
		if len(x.Results) != 1 || x.Results[0].PNG == "" {
			t.Fatalf("chart results: %+v", x.Results)
		}
		raw, err := base64.StdEncoding.DecodeString(x.Results[0].PNG)
		if err != nil {
			t.Fatal(err)
		}
		got, err := png.DecodeConfig(bytes.NewReader(raw))
		if err != nil || got.Width != x.Results[0].Width || got.Height != x.Results[0].Height {
			t.Errorf("chart result: reported %dx%d, the PNG %+v %v", x.Results[0].Width, x.Results[0].Height, got, err)
		}
		// And as data: a line chart's title, labels and points; bars by
		// category; two axes are a superchart.
		chartOf := func(code string) map[string]any {
			t.Helper()
			x := run(0, "-c", code)
			if len(x.Results) != 1 || len(x.Results[0].Chart) == 0 || x.Results[0].PNG == "" {
				t.Fatalf("%s: results %+v", code, x.Results)
			}
			var c map[string]any
			if err := json.Unmarshal(x.Results[0].Chart, &c); err != nil {
				t.Fatal(err)
			}
			return c
		}
		c := chartOf("fig, ax = plt.subplots()\nax.plot([1, 2, 3], [1, 4, 9], label='squares')\nax.set_title('Growth')\nax.set_xlabel('n')\nplt.show()")
		if c["type"] != "line" || c["title"] != "Growth" || c["x_label"] != "n" || fmt.Sprint(c["elements"]) != "[map[label:squares points:[[1 1] [2 4] [3 9]]]]" {
			t.Errorf("line chart: %v", c)
		}
		c = chartOf("plt.bar(['a', 'b'], [3, 5])\nplt.show()")
		if c["type"] != "bar" || fmt.Sprint(c["elements"]) != "[map[group: label:a value:3] map[group: label:b value:5]]" {
			t.Errorf("bar chart: %v", c)
		}
		c = chartOf("fig, (a, b) = plt.subplots(1, 2)\na.pie([1, 3], labels=['x', 'y'])\nb.boxplot([[1, 2, 3, 4, 100]])\nplt.show()")
		els, _ := c["elements"].([]any)
		if c["type"] != "superchart" || len(els) != 2 || els[0].(map[string]any)["type"] != "pie" || els[1].(map[string]any)["type"] != "box_and_whisker" {
			t.Errorf("superchart: %v", c)
		}
	})
	t.Run("DataFrame", func(t *testing.T) {
		x := run(0, "-c", "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
		if len(x.Results) != 1 || !strings.Contains(x.Results[0].HTML, "<table") || !strings.Contains(x.Results[0].Text, "a  b") {
			t.Fatalf("DataFrame: %+v", x.Results)
		}
	})
	t.Run("Exception", func(t *testing.T) {
		x := run(1, "-c", "def f():\n    return 1 / 0\nf()")
		if x.Status != "error" || x.Error == nil || x.Error.Name != "ZeroDivisionError" || !strings.Contains(x.Error.Traceback, "return 1 / 0") {
			t.Fatalf("exception: %+v %+v", x, x.Error)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		start := time.Now()
		x := run(124, "--timeout", "3", "-c", "while True: pass")
		if x.Status != "timeout" || x.Error == nil || x.Error.Name != "TimeoutError" {
			t.Fatalf("timeout: %+v %+v", x, x.Error)
		}
		if d := time.Since(start); d > 60*time.Second {
			t.Errorf("a 3 s timeout took %v", d)
		}
		if y := run(0, "-c", "x"); mainText(y) != "41" {
			t.Fatalf("after the timeout: %+v", y)
		}
	})
	t.Run("Contexts", func(t *testing.T) {
		var c sandbox.CodeContext
		cli.OK("", &c, "code-context", "create", id)
		run(0, "--context", c.ID, "-c", "y = 5")
		if x := run(1, "-c", "y"); x.Error == nil || x.Error.Name != "NameError" {
			t.Errorf("the default context sees another's variable: %+v", x)
		}
		if x := run(1, "--context", c.ID, "-c", "x"); x.Error == nil || x.Error.Name != "NameError" {
			t.Errorf("a new context sees the default's variable: %+v", x)
		}
		var l struct {
			Contexts []sandbox.CodeContext `json:"contexts"`
		}
		cli.OK("", &l, "code-context", "list", id)
		if len(l.Contexts) < 2 {
			t.Errorf("contexts: %+v", l)
		}
		cli.OK("", nil, "code-context", "delete", id, c.ID)
		if _, e, code := cli.Run("", "run-code", id, "--context", c.ID, "-c", "1"); code == 0 || !strings.Contains(e, "404") && !strings.Contains(e, "not found") && !strings.Contains(e, "no context") {
			t.Errorf("a deleted context: exit %d %s", code, e)
		}
		// Bash: variables and the directory last.
		run(0, "--language", "bash", "-c", "cd /tmp; X=5")
		if x := run(0, "--language", "bash", "-c", "echo $X $PWD"); x.Stdout != "5 /tmp\n" {
			t.Errorf("bash state: %q", x.Stdout)
		}
		if x := run(1, "--language", "bash", "-c", "false"); x.Error == nil || x.Error.Name != "ExitCode" || x.Error.Value != "1" {
			t.Errorf("bash exit status: %+v", x.Error)
		}
		// JavaScript: declarations last, await at top level; Math.random
		// drawn once, for Fork.
		run(0, "--language", "javascript", "-c", "let n = 40; const f = async () => 2; Math.random()")
		if x := run(0, "--language", "javascript", "-c", "console.log('js'); n + await f() + (await import('node:path')).sep.length - 1"); mainText(x) != "42" || x.Stdout != "js\n" || x.ContextID != "default-javascript" {
			t.Errorf("javascript state: %+v", x)
		}
		if x := run(1, "--language", "javascript", "-c", "null.x"); x.Error == nil || x.Error.Name != "TypeError" || !strings.Contains(x.Error.Traceback, "<cell") {
			t.Errorf("javascript exception: %+v", x.Error)
		}
		// TypeScript: the same kernel, its cells transpiled (Debian's compiler).
		if x := run(0, "--language", "typescript", "-c", "enum E { A = 40 }\nconst t: number = E.A; t + 2"); mainText(x) != "42" || x.ContextID != "default-typescript" {
			t.Errorf("typescript: %+v", x)
		}
	})
	t.Run("Flood", func(t *testing.T) {
		// 24 MiB printed, three times what the host keeps: it keeps its
		// bound (8 MiB), says so, and the context goes on. (That it
		// forwards no more than its stream bound, 64 MiB, codeinterp's
		// tests show with small bounds: a flood past it here took 40 s
		// of the suite under emulation.)
		x := run(0, "--timeout", "600", "-c", "import sys\nfor _ in range(24):\n    sys.stdout.write('x' * (1 << 20))\n'done'")
		if !x.StdoutTruncated || len(x.Stdout) != 8<<20 || mainText(x) != "'done'" {
			t.Fatalf("flood: %d bytes kept, truncated %v, value %q", len(x.Stdout), x.StdoutTruncated, mainText(x))
		}
	})
	t.Run("Stream", func(t *testing.T) {
		// Server-sent events as the cell runs.
		body, _ := json.Marshal(sandbox.CodeRequest{Code: "import time\nprint('a', flush=True)\ntime.sleep(2)\nprint('b')\n1/0"})
		req, _ := http.NewRequest("POST", srv.URL+"/v1/sandboxes/"+id+"/code", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+srv.Key)
		req.Header.Set("Accept", "text/event-stream")
		resp, err := srv.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var events []string
		var at []time.Time
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if ev, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
				events, at = append(events, ev), append(at, time.Now())
			}
		}
		if strings.Join(events, ",") != "stdout,stdout,exception,end" {
			t.Fatalf("events: %v", events)
		}
		if gap := at[1].Sub(at[0]); gap < time.Second {
			t.Errorf("output was not streamed: %v between a and b", gap)
		}
	})
	t.Run("Fork", func(t *testing.T) {
		// A fork's kernels go on from the source's state, with their own
		// randomness.
		var fork sandbox.Sandbox
		cli.OK("", &fork, "fork", id)
		cli.Made(fork.ID)
		code := "import random, numpy\n(random.random(), float(numpy.random.random()), x)"
		a := run(0, "-c", code)
		o, e, exit := cli.Run("", "run-code", fork.ID, "-c", code)
		var b sandbox.CodeExecution
		if exit != 0 || json.Unmarshal([]byte(o), &b) != nil {
			t.Fatalf("in the fork: %d %s %s", exit, o, e)
		}
		if !strings.HasSuffix(mainText(b), ", 41)") {
			t.Errorf("the fork's state: %q", mainText(b))
		}
		if mainText(a) == mainText(b) {
			t.Errorf("the fork shares its source's randomness: %s", mainText(a))
		}
		// A JavaScript kernel's Math.random, drawn from before the fork.
		js := []string{"--language", "javascript", "-c", "[Math.random(), n]"}
		a = run(0, js...)
		o, e, exit = cli.Run("", append([]string{"run-code", fork.ID}, js...)...)
		if exit != 0 || json.Unmarshal([]byte(o), &b) != nil {
			t.Fatalf("javascript in the fork: %d %s %s", exit, o, e)
		}
		if !strings.HasSuffix(mainText(b), ", 40 ]") || mainText(a) == mainText(b) {
			t.Errorf("javascript in the source and the fork: %s and %s", mainText(a), mainText(b))
		}
	})
	// The Python client's live tests, on this sandbox (in contexts of
	// their own), from the source tree. (The TypeScript client's,
	// sdk/typescript/test/code.test.mjs, run the same way by hand: make
	// test runs its offline ones, in TestWalkthrough.)
	t.Run("Python", func(t *testing.T) {
		out := testserver.Run(t, srv, s, s.Root, 5*time.Minute, "env", "HAREBOX_TEST_CODE_SANDBOX="+id,
			"PYTHONPATH="+filepath.Join(s.Root, "sdk", "python"), "PYTHONDONTWRITEBYTECODE=1",
			"/usr/bin/python3", "-m", "pytest", filepath.Join(s.Root, "sdk", "python", "tests", "test_code.py"), "-q", "-p", "no:cacheprovider")
		if !strings.Contains(out, " passed") || strings.Contains(out, " failed") || strings.Contains(out, " skipped") {
			t.Fatalf("pytest:\n%s", out)
		}
	})
	t.Run("E2BSDK", func(t *testing.T) {
		secret := srv.E2BKey(t)
		dir := filepath.Join(s.Root, "e2e", "e2bsdk")
		testserver.NPMInstalled(t, srv, s, dir)
		out := testserver.Run(t, srv, s, dir, 5*time.Minute, "env", "E2B_API_URL=http://"+e2bAddr, "E2B_SANDBOX_URL=http://"+e2bAddr,
			"E2B_API_KEY="+secret, "E2B_TEST_SANDBOX="+strings.TrimPrefix(id, "sbx_"), "node", "--test", "--test-reporter=tap", "codeinterp.test.mjs")
		testserver.LogSlowTAP(t, out)
		if !strings.Contains(out, "# fail 0") || strings.Contains(out, "# pass 0") {
			t.Fatalf("node --test:\n%s", out)
		}
	})
	t.Run("Died", func(t *testing.T) {
		x := run(125, "-c", "import os\nos._exit(1)")
		if x.Status != "died" || x.Error == nil || x.Error.Name != "KernelDied" {
			t.Fatalf("a dead kernel: %+v %+v", x, x.Error)
		}
		if x := run(125, "-c", "1"); x.Status != "died" {
			t.Errorf("the dead kernel answered: %+v", x)
		}
		cli.OK("", nil, "code-context", "restart", id, "default")
		if x := run(1, "-c", "x"); x.Error == nil || x.Error.Name != "NameError" {
			t.Errorf("a restarted kernel kept its state: %+v", x)
		}
		if x := run(0, "-c", "6 * 7"); mainText(x) != "42" {
			t.Errorf("after the restart: %+v", x)
		}
	})
	t.Run("LyingInterpreter", func(t *testing.T) {
		// Root in the guest replaces the interpreter by a server that
		// answers each cell with another lie; each is an error, and the
		// host and the sandbox's agent go on.
		liar := `import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        code = json.loads(self.rfile.read(int(self.headers['Content-Length'])))['code']
        lies = {
            'type': [{'type': 'stdout', 'text': 5}],
            'huge': [{'type': 'stdout', 'text': 'x' * (30 << 20)}],
            'png': [{'type': 'result', 'main': True, 'data': {'image/png': 'bm90IGEgcG5n'}}],
            'kind': [{'type': 'shell', 'text': 'rm -rf /'}],
            'noend': [{'type': 'stdout', 'text': 'a'}],
        }[code]
        self.send_response(200)
        self.send_header('Content-Type', 'application/x-ndjson')
        self.end_headers()
        for l in lies:
            self.wfile.write(json.dumps(l).encode() + b'\n')
        self.wfile.flush()
        self.close_connection = True
http.server.HTTPServer(('127.0.0.1', 49999), H).serve_forever()
`
		local := filepath.Join(t.TempDir(), "liar.py")
		if err := os.WriteFile(local, []byte(liar), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, e, code := cli.Run("", "file", "write", id, "--path", "/tmp/liar.py", "--from", local); code != 0 {
			t.Fatalf("write the liar: %s", e)
		}
		if o, e, code := cli.Run("", "exec", id, "--user", "root", "--", "sh", "-c",
			"systemctl stop harebox-interpreter && (setsid python3 /tmp/liar.py >/dev/null 2>&1 &) && sleep 2"); code != 0 {
			t.Fatalf("start the liar: %d %s %s", code, o, e)
		}
		for _, lie := range []string{"type", "huge", "png", "kind", "noend"} {
			_, e, code := cli.Run("", "run-code", id, "-c", lie)
			if code == 0 || !strings.Contains(e, "answered wrongly") {
				t.Errorf("lie %s: exit %d, %s", lie, code, e)
			}
		}
		if o, _, code := cli.Run("", "exec", id, "--", "echo", "still here"); code != 0 || o != "still here\n" {
			t.Errorf("after the lies: %d %q", code, o)
		}
	})
}
