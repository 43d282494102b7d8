package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Real `go test -json` output of a package with a passing, a failing and
// a hanging test: testlog prints the failure's and the hang's output and
// the package's result, not the passing test's, and ranks the times.
func TestRealGoTest(t *testing.T) {
	dir, js := goTestJSON(t, "3s", `package m

import (
	"testing"
	"time"
)

func TestQuiet(t *testing.T) { t.Log("quiet output"); time.Sleep(300 * time.Millisecond) }

func TestBroken(t *testing.T) {
	t.Run("sub", func(t *testing.T) { t.Error("broken output") })
}

func TestHangs(t *testing.T) { t.Log("hang output"); time.Sleep(time.Minute) }
`)
	var out strings.Builder
	times := filepath.Join(dir, "times.tsv")
	if err := run(strings.NewReader(string(js)+"not json: passed as it is\n"), &out, times, 2); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"broken output", "--- FAIL: TestBroken", "hang output", "panic: test timed out", "FAIL\texample.test/m",
		"not json: passed as it is", "the 2 slowest tests:", "TestQuiet", "tests: 1 passed, 2 failed, 0 skipped\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in\n%s", want, got)
		}
	}
	if strings.Contains(got, "quiet output") {
		t.Errorf("a passing test's output was printed:\n%s", got)
	}
}

// A test whose subtests are parallel takes until its subtests end: go
// test's own time for it ends with its function, before they run.
func TestParallelSubtestsTimed(t *testing.T) {
	dir, js := goTestJSON(t, "1m", `package m

import (
	"testing"
	"time"
)

func TestParent(t *testing.T) {
	for _, name := range []string{"a", "b"} {
		t.Run(name, func(t *testing.T) { t.Parallel(); time.Sleep(600 * time.Millisecond) })
	}
}

func TestShort(t *testing.T) { time.Sleep(200 * time.Millisecond) }
`)
	if !strings.Contains(string(js), `"Test":"TestParent","Elapsed":0`) {
		t.Fatalf("go test's own time for TestParent is not 0 here: the case is not tested\n%s", js)
	}
	var out strings.Builder
	if err := run(strings.NewReader(string(js)), &out, filepath.Join(dir, "times.tsv"), 1); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(out.String(), "\n")
	var top string
	for i, l := range lines {
		if strings.HasPrefix(l, "the 1 slowest tests:") && i+1 < len(lines) {
			top = lines[i+1]
		}
	}
	f := strings.Fields(top)
	if len(f) != 3 || f[2] != "TestParent" {
		t.Fatalf("the slowest test: %q, want TestParent\n%s", top, out.String())
	}
	if d, err := time.ParseDuration(f[0]); err != nil || d < 600*time.Millisecond {
		t.Errorf("TestParent took %s, want at least its subtests' 600ms", f[0])
	}
}

// goTestJSON runs `go test -json` with timeout on a module of one test
// file (package m), in a directory of the test's, and returns the
// directory and the output (whatever the tests' results).
func goTestJSON(t *testing.T, timeout, src string) (dir string, js []byte) {
	t.Helper()
	dir = t.TempDir()
	for name, s := range map[string]string{"go.mod": "module example.test/m\n\ngo 1.26\n", "m_test.go": src} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "test", "-json", "-timeout", timeout, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	js, _ = cmd.Output()
	return dir, js
}
