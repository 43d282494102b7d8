package console

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDistBuilt: web/ type-checks (tsc, strict), and dist/ (embedded,
// committed) is what web/ builds to now.
func TestDistBuilt(t *testing.T) {
	if _, err := os.Stat("web/node_modules/.bin/esbuild"); err != nil {
		t.Skip("the console's toolchain is not installed (make deps installs it)")
	}
	check := exec.Command("web/node_modules/.bin/tsc", "--noEmit", "-p", "web")
	if b, err := check.CombinedOutput(); err != nil {
		t.Fatalf("tsc: %v\n%s", err, b)
	}
	out := t.TempDir()
	cmd := exec.Command("node", "build.mjs", out)
	cmd.Dir = "web"
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	files, _ := filepath.Glob(filepath.Join(out, "*"))
	if len(files) == 0 {
		t.Fatal("the build made nothing")
	}
	for _, f := range files {
		built, _ := os.ReadFile(f)
		committed, err := dist.ReadFile("dist/" + filepath.Base(f))
		if err != nil || !bytes.Equal(built, committed) {
			t.Errorf("console/dist/%s is not what console/web builds to: run make console and commit it", filepath.Base(f))
		}
	}
}

func TestDropCookie(t *testing.T) {
	h := http.Header{}
	h.Set("Cookie", "a=1; "+Cookie+"=secret; b=2")
	DropCookie(h)
	if got := h.Get("Cookie"); got != "a=1; b=2" {
		t.Fatalf("Cookie: %q", got)
	}
	h = http.Header{}
	h.Set("Cookie", Cookie+"=secret")
	if DropCookie(h); h.Get("Cookie") != "" {
		t.Fatalf("Cookie: %q", h.Get("Cookie"))
	}
	h = http.Header{}
	h.Add("Set-Cookie", "a=1; Path=/")
	h.Add("Set-Cookie", strings.ToUpper(Cookie)+"=fixed; Path=/")
	h.Add("Set-Cookie", Cookie+"=fixed; Path=/; HttpOnly")
	DropSetCookie(h)
	if got := h.Values("Set-Cookie"); len(got) != 1 || got[0] != "a=1; Path=/" {
		t.Fatalf("Set-Cookie: %q", got)
	}
}
