package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Real `go test -json` output of a package with a passing, a failing and
// a hanging test: testlog prints the failure's and the hang's output and
// the package's result, not the passing test's, and ranks the times.
func TestRealGoTest(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.test/m\n\ngo 1.26\n")
	write("m_test.go", `package m

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
	cmd := exec.Command("go", "test", "-json", "-timeout", "3s", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	js, _ := cmd.Output()
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
