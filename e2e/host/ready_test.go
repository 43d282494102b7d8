package host

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor/plugin"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testserver"
)

// TestReady: /health says the process is alive; /ready says whether it
// can serve. With its hypervisor plugin dead and unable to start again,
// the server stays alive and is not ready (503, the hypervisor named);
// once the plugin can start, it is ready again by itself.
func TestReady(t *testing.T) {
	s := testserver.PrepareNoVM(t)
	dataDir, err := os.MkdirTemp("", "hbrd")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	// A plugin binary of this test's own, to make unrunnable.
	pluginCopy := filepath.Join(dataDir, "harebox-plugin-qemu")
	testserver.CopyFile(t, s.Plugin, pluginCopy)
	os.Chmod(pluginCopy, 0o755)
	srv := testserver.Launch(t, s, dataDir, "--image-dir", filepath.Join(dataDir, "no-images"), "--plugin", pluginCopy, "--network", "none")
	defer srv.Stop(t)
	get := func(path string) (int, map[string]any) {
		t.Helper()
		resp, err := srv.HTTP.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	if code, body := get("/ready"); code != 200 || body["status"] != "ready" {
		t.Fatalf("/ready: %d %v", code, body)
	}
	// A reload (systemctl reload: SIGHUP) of a server without TLS files
	// leaves it running; Go's default would end it.
	srv.Cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(300 * time.Millisecond)
	if code, _ := get("/health"); code != 200 || !strings.Contains(srv.Log.String(), "SIGHUP: nothing to reload") {
		t.Fatalf("after SIGHUP: %d\n%s", code, srv.Log.String())
	}
	os.Chmod(pluginCopy, 0o644)
	for _, p := range procs.WithEnv(plugin.OwnerEnv + "=" + dataDir) {
		if p.IsPlugin() {
			syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
	code, body := 0, map[string]any{}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if code, body = get("/ready"); code == 503 {
			break
		}
	}
	checks, _ := body["checks"].(map[string]any)
	if code != 503 || body["status"] != "not_ready" || checks["hypervisor"] != "unavailable" || checks["database"] != "ok" {
		t.Fatalf("/ready with no plugin: %d %v", code, body)
	}
	if code, _ := get("/health"); code != 200 {
		t.Errorf("/health with no plugin: %d", code)
	}
	os.Chmod(pluginCopy, 0o755)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if code, body = get("/ready"); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/ready once the plugin can start: %d %v", code, body)
		}
	}
}
