package host

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testserver"
)

// TestLoad: as many small sandboxes as admission allows on this machine,
// then get, exec and file (write, then read back and compared) traffic
// from four clients for HAREBOX_LOAD_SECONDS (10 by default; make
// reliability runs 60). It reports the sandboxes held, requests per
// second, p50/p99 of each kind of request, host memory per
// sandbox and the errors; it fails on any error other than admission
// refusals, and on a refusal that is not a clear 503 over_capacity.
// (Figures, not assertions on time: the machine's speed is not the test's.)
func TestLoad(t *testing.T) {
	s := testserver.Prepare(t)
	seconds := testserver.EnvCount(t, "HAREBOX_LOAD_SECONDS", 10)
	dataDir, err := os.MkdirTemp("", "hbl")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	var cur atomic.Pointer[testserver.Server]
	// Golden snapshots, as hareboxd runs by default: the first create
	// boots, the others restore.
	srv := testserver.Launch(t, s, dataDir, "--image-dir", s.ImageDir, "--plugin", s.Plugin, "--network", "none", "--golden-snapshots")
	cur.Store(srv)
	c := &crashClients{cur: &cur}
	var ids []string
	defer func() {
		for _, id := range ids {
			c.do(srv, "DELETE", "/v1/sandboxes/"+id, nil)
		}
		srv.Stop(t)
		testserver.NoLeftovers(t, dataDir)
	}()

	// Fill the host, two creates at a time, until admission says no.
	var mu sync.Mutex
	var refusal string
	var refusalTook time.Duration
	full := false
	for !full {
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				code, b, err := c.do(srv, "POST", "/v1/sandboxes", []byte(`{"image": "minimal", "ttl_seconds": 1800}`))
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && code == 201:
					var box struct{ ID string }
					json.Unmarshal(b, &box)
					ids = append(ids, box.ID)
				case err == nil && code == 503 && bytes.Contains(b, []byte(`"code":"over_capacity"`)):
					full, refusal, refusalTook = true, string(b), time.Since(start)
				default:
					t.Errorf("create: %d %s %v", code, b, err)
					full = true
				}
			}()
		}
		wg.Wait()
	}
	if len(ids) == 0 {
		t.Fatal("no sandbox was admitted")
	}
	t.Logf("held %d sandboxes; the next create was refused in %v: %s", len(ids), refusalTook.Round(time.Millisecond), strings.TrimSpace(refusal))

	// Traffic.
	type sample struct {
		op string
		d  time.Duration
	}
	var samples []sample
	var errs []string
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				id := ids[(w+i)%len(ids)]
				// get, exec, a file write, and that file read back from the
				// same sandbox, in turn (each client has its own file).
				var content []byte
				op, method, path, body := "get", "GET", "/v1/sandboxes/"+id, []byte(nil)
				switch i % 4 {
				case 1:
					op, method, path, body = "exec", "POST", "/v1/sandboxes/"+id+"/exec", []byte(`{"cmd": "echo x", "timeout_seconds": 30}`)
				case 2:
					content = []byte(fmt.Sprintf("client %d request %d\n", w, i))
					op, method, path, body = "write", "PUT", fmt.Sprintf("/v1/sandboxes/%s/files?path=/tmp/load-%d", id, w), content
				case 3:
					prev := ids[(w+i-1)%len(ids)]
					content = []byte(fmt.Sprintf("client %d request %d\n", w, i-1))
					op, method, path = "read", "GET", fmt.Sprintf("/v1/sandboxes/%s/files?path=/tmp/load-%d", prev, w)
				}
				start := time.Now()
				code, b, err := c.do(srv, method, path, body)
				d := time.Since(start)
				mu.Lock()
				switch {
				case err != nil || code != 200:
					errs = append(errs, fmt.Sprintf("%s %s: %d %s %v", method, path, code, b, err))
				case op == "read" && !bytes.Equal(b, content):
					// (The write of the turn before, by this client alone.)
					errs = append(errs, fmt.Sprintf("%s %s: read %q, wrote %q", method, path, b, content))
				default:
					samples = append(samples, sample{op, d})
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	pct := func(op string, p float64) time.Duration {
		var ds []time.Duration
		for _, s := range samples {
			if s.op == op {
				ds = append(ds, s.d)
			}
		}
		if len(ds) == 0 {
			return 0
		}
		slices.Sort(ds)
		return ds[min(len(ds)-1, int(p*float64(len(ds))))]
	}
	var rss int64
	for _, p := range procs.Naming(filepath.Join(dataDir, "m") + "/") {
		if p.IsVMM() {
			rss += vmRSS(p.PID)
		}
	}
	t.Logf("%d requests in %d s from 4 clients: %.0f/s; get p50 %v p99 %v; exec p50 %v p99 %v; file write p50 %v p99 %v; read p50 %v p99 %v; %d errors; host memory %d MiB per sandbox (VMM RSS)",
		len(samples)+len(errs), seconds, float64(len(samples)+len(errs))/float64(seconds),
		pct("get", 0.5).Round(time.Microsecond), pct("get", 0.99).Round(time.Microsecond),
		pct("exec", 0.5).Round(time.Microsecond), pct("exec", 0.99).Round(time.Microsecond),
		pct("write", 0.5).Round(time.Microsecond), pct("write", 0.99).Round(time.Microsecond),
		pct("read", 0.5).Round(time.Microsecond), pct("read", 0.99).Round(time.Microsecond),
		len(errs), rss>>20/int64(len(ids)))
	for i, e := range errs {
		if i == 5 {
			break
		}
		t.Errorf("request failed under load: %s", e)
	}
}

// vmRSS is a process's resident memory in bytes, or 0.
func vmRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
