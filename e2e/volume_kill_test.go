package e2e_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/sandbox"
)

// TestVolumeSurvivesKill: a guest appends to a file on a volume, each
// line synced before its exec is acknowledged, while hareboxd is killed
// with -9 and started again; then its VMM is killed with -9 too, so
// nothing is flushed by a clean stop. Every acknowledged line is on the
// volume when the next sandbox mounts it.
func TestVolumeSurvivesKill(t *testing.T) {
	t.Parallel()
	s := testserver.Prepare(t)
	dataDir, err := os.MkdirTemp("", "hbvk")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.Start(t, s, dataDir)
	defer testserver.Finish(t, srv, dataDir)
	cli := &testserver.CLI{T: t, S: s, Srv: srv}
	cli.OK("", nil, "volume", "create", "log", "--size", "1")
	var a sandbox.Sandbox
	cli.OK("", &a, "new", "--image", "minimal", "--ttl", "900", "--volume", "log:/mnt/log")

	// acked holds the last acknowledged line; ok every acknowledged one
	// (a write refused while hareboxd is down is not, and may be absent).
	var acked atomic.Int64
	var mu sync.Mutex
	var ok []int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_, _, code := testserver.RunCLI(t, s, srv, "", "exec", a.ID, "--user", "root", "--", "sh", "-c", fmt.Sprintf("echo %d >> /mnt/log/lines && sync", i))
			if code == 0 {
				acked.Store(int64(i))
				mu.Lock()
				ok = append(ok, int64(i))
				mu.Unlock()
			} else {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	time.Sleep(3 * time.Second)
	srv.Cmd.Process.Kill() // -9, in the middle of writes
	srv.Cmd.Wait()
	before := acked.Load()
	testserver.Relaunch(t, srv)
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	n := acked.Load()
	if before == 0 || n <= before {
		t.Fatalf("acknowledged writes: %d before the kill, %d in all; want some on each side", before, n)
	}
	if killed := procs.KillVMMs(filepath.Join(dataDir, "m", a.ID)); killed == 0 {
		t.Fatal("no VMM of the sandbox to kill")
	}
	// The machine died: its sandbox goes, and gives the volume back.
	deadline := time.Now().Add(90 * time.Second)
	for {
		var v struct {
			Attachments []any `json:"attachments"`
		}
		cli.OK("", &v, "volume", "get", "log")
		if len(v.Attachments) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the volume is still attached %v after its sandbox's VMM died", v.Attachments)
		}
		time.Sleep(500 * time.Millisecond)
	}
	var b sandbox.Sandbox
	cli.OK("", &b, "new", "--image", "minimal", "--ttl", "900", "--volume", "log:/mnt/log:ro")
	defer cli.Run("", "delete", b.ID)
	o := cli.OK("", nil, "exec", b.ID, "--", "cat", "/mnt/log/lines")
	have := map[int64]bool{}
	for _, l := range strings.Fields(o) {
		if i, err := strconv.ParseInt(l, 10, 64); err == nil {
			have[i] = true
		}
	}
	for _, i := range ok {
		if !have[i] {
			t.Errorf("acknowledged line %d of %d is not on the volume", i, n)
		}
	}
	if t.Failed() {
		t.Logf("the file:\n%q", o)
	}
	t.Logf("%d synced lines acknowledged (the last %d), up to %d before hareboxd was killed; all there after its VMM was killed too", len(ok), n, before)
}
