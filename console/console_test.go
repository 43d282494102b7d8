package console

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSessions(t *testing.T) {
	now := time.Unix(1e9, 0)
	s := NewSessions(SessionOptions{Lifetime: time.Hour, Idle: 10 * time.Minute, Max: 3, Now: func() time.Time { return now }})
	id, sess := s.Open("hbk_a")
	if sess.Key != "hbk_a" || sess.CSRF == "" || id == sess.CSRF || !sess.Expires.Equal(now.Add(time.Hour)) {
		t.Fatalf("Open: %q %+v", id, sess)
	}
	if !sess.CheckCSRF(sess.CSRF) || sess.CheckCSRF("") || sess.CheckCSRF(sess.CSRF[1:]) {
		t.Fatal("CheckCSRF")
	}
	if _, ok := s.Get(id + "0"); ok {
		t.Fatal("an unknown ID opened a session")
	}
	// Used every 9 minutes it lives until its lifetime ends, not longer.
	for i := 0; i < 6; i++ {
		now = now.Add(9 * time.Minute)
		if _, ok := s.Get(id); !ok {
			t.Fatalf("ended after %d uses", i)
		}
	}
	now = now.Add(7 * time.Minute) // 61 minutes after sign-in
	if _, ok := s.Get(id); ok {
		t.Fatal("a session outlived its lifetime")
	}
	// Idle for longer than Idle: ended.
	id, _ = s.Open("hbk_b")
	now = now.Add(10 * time.Minute)
	if _, ok := s.Get(id); ok {
		t.Fatal("an idle session stayed open")
	}
	// Close ends it; Max bounds them (the one nearest its end goes).
	id, _ = s.Open("hbk_c")
	s.Close(id)
	if _, ok := s.Get(id); ok || s.Len() != 0 {
		t.Fatal("Close")
	}
	old, _ := s.Open("hbk_1")
	now = now.Add(time.Minute)
	ids := []string{}
	for _, k := range []string{"hbk_2", "hbk_3", "hbk_4"} {
		id, _ := s.Open(k)
		ids = append(ids, id)
	}
	if s.Len() != 3 {
		t.Fatalf("%d sessions, max 3", s.Len())
	}
	if _, ok := s.Get(old); ok {
		t.Fatal("the oldest session stayed past Max")
	}
	for _, id := range ids {
		if _, ok := s.Get(id); !ok {
			t.Fatal("a newer session was dropped")
		}
	}
}

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
