package cloudhypervisor

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fullConfig uses every VmConfig field the backend sends.
func fullConfig(dir string) VmConfig {
	nested := false
	return VmConfig{
		Cpus:    &CpusConfig{BootVcpus: 2, MaxVcpus: 2, Nested: &nested},
		Memory:  &MemoryConfig{Size: 512 << 20, Shared: true},
		Payload: PayloadConfig{Kernel: "/k/vmlinux", Initramfs: "/k/initrd", Cmdline: "console=ttyS0"},
		Disks: []DiskConfig{
			{Path: "/d/root.qcow2", ImageType: ImageTypeQcow2, BackingFiles: true},
			{Path: "/d/data.raw", Readonly: true, ImageType: ImageTypeRaw},
		},
		Net:            []NetConfig{{Tap: "hbx0", Mac: "52:54:00:12:34:56"}},
		Rng:            &RngConfig{Src: "/dev/urandom"},
		Serial:         &SerialConfig{Mode: ConsoleModeFile, File: filepath.Join(dir, "serial.log")},
		Console:        &ConsoleConfig{Mode: ConsoleModeOff},
		Vsock:          &VsockConfig{Cid: GuestCID, Socket: filepath.Join(dir, "vsock.sock")},
		LandlockEnable: true,
		LandlockRules:  []LandlockConfig{{Path: dir, Access: "rw"}},
	}
}

func TestClientCalls(t *testing.T) {
	ctx := testCtx(t)
	stub, sock := startStub(t)
	dir := filepath.Dir(sock)
	c := NewClient(sock)

	ping, err := c.Ping(ctx)
	if err != nil || ping.Version != "53.0.0" || ping.Pid != int64(os.Getpid()) {
		t.Fatalf("Ping = %+v, %v", ping, err)
	}
	cfg := fullConfig(dir)
	if err := c.CreateVM(ctx, cfg); err != nil {
		t.Fatalf("CreateVM: %v", err)
	}
	if err := c.BootVM(ctx); err != nil {
		t.Fatalf("BootVM: %v", err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	if info.State != VmStateRunning || info.Config.Memory.Size != 512<<20 || info.Config.Vsock.Socket != cfg.Vsock.Socket ||
		len(info.Config.Disks) != 2 || !info.Config.Disks[0].BackingFiles || info.Config.Net[0].Tap != "hbx0" ||
		*info.Config.Cpus.Nested || info.MemoryActualSize == nil {
		t.Fatalf("Info = %+v", info)
	}
	counters, err := c.Counters(ctx)
	if err != nil || counters["_disk0"]["read_bytes"] != 512 {
		t.Fatalf("Counters = %v, %v", counters, err)
	}
	if err := c.PauseVM(ctx); err != nil {
		t.Fatalf("PauseVM: %v", err)
	}
	if info, _ := c.Info(ctx); info.State != VmStatePaused {
		t.Fatalf("state after pause = %s", info.State)
	}
	snap := filepath.Join(dir, "snap")
	os.Mkdir(snap, 0o700)
	if err := c.Snapshot(ctx, VmSnapshotConfig{DestinationURL: "file://" + snap}); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if err := c.ResumeVM(ctx); err != nil {
		t.Fatalf("ResumeVM: %v", err)
	}
	if err := c.ShutdownVM(ctx); err != nil {
		t.Fatalf("ShutdownVM: %v", err)
	}
	if err := c.DeleteVM(ctx); err != nil {
		t.Fatalf("DeleteVM: %v", err)
	}
	// The snapshot's disks do not exist here; point them at real files.
	for _, name := range []string{"root.qcow2", "data.raw"} {
		os.WriteFile(filepath.Join(dir, name), nil, 0o600)
	}
	cfgJSON, _ := readConfig(filepath.Join(snap, vmConfigName))
	for i, d := range cfgJSON["disks"].([]any) {
		d.(map[string]any)["path"] = filepath.Join(dir, []string{"root.qcow2", "data.raw"}[i])
	}
	writeJSON(filepath.Join(snap, vmConfigName), cfgJSON)
	if err := c.Restore(ctx, RestoreConfig{SourceURL: "file://" + snap, Prefault: true}); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if info, _ := c.Info(ctx); info.State != VmStatePaused {
		t.Fatalf("state after restore = %s", info.State)
	}
	if err := c.ShutdownVMM(ctx); err != nil {
		t.Fatalf("ShutdownVMM: %v", err)
	}

	want := []string{"GET /vmm.ping", "PUT /vm.create", "PUT /vm.boot", "GET /vm.info", "GET /vm.counters",
		"PUT /vm.pause", "GET /vm.info", "PUT /vm.snapshot", "PUT /vm.resume", "PUT /vm.shutdown",
		"PUT /vm.delete", "PUT /vm.restore", "GET /vm.info", "PUT /vmm.shutdown"}
	if got := stub.getCalls(); !slices.Equal(got, want) {
		t.Errorf("calls:\n got %q\nwant %q", got, want)
	}
}

func TestClientErrorMapping(t *testing.T) {
	ctx := testCtx(t)
	stub, sock := startStub(t)
	c := NewClient(sock)

	// 404 from the spec: boot before create.
	err := c.BootVM(ctx)
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound || !errors.Is(err, hypervisor.ErrNotFound) ||
		!strings.Contains(err.Error(), "VM is not created") {
		t.Fatalf("BootVM before create: %v", err)
	}
	// 405 from the spec: pause a VM that is not booted.
	if err := c.CreateVM(ctx, fullConfig(filepath.Dir(sock))); err != nil {
		t.Fatal(err)
	}
	if err := c.PauseVM(ctx); !errors.Is(err, hypervisor.ErrState) || !strings.Contains(err.Error(), "405") {
		t.Fatalf("PauseVM when created: %v", err)
	}
	// 500 with a body: no portable kind, the VMM's message kept on one line.
	stub.setFault("/vm.info", http.StatusInternalServerError, "Error from API:\nInternal error\x00")
	_, err = c.Info(ctx)
	if !errors.As(err, &apiErr) || apiErr.Status != 500 || hypervisor.KindOf(err) != nil ||
		apiErr.Message != "Error from API: Internal error" {
		t.Fatalf("Info with 500: %v (%q)", err, apiErr.Message)
	}
	stub.setFault("/vm.resume", http.StatusBadRequest, "bad")
	if err := c.ResumeVM(ctx); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Fatalf("ResumeVM with 400: %v", err)
	}
	stub.setFault("/vm.counters", http.StatusServiceUnavailable, "")
	if _, err := c.Counters(ctx); !errors.Is(err, hypervisor.ErrUnavailable) {
		t.Fatalf("Counters with 503: %v", err)
	}
}

func TestClientNoVMM(t *testing.T) {
	c := NewClient(filepath.Join(shortTempDir(t), "gone.sock"))
	if _, err := c.Ping(testCtx(t)); !errors.Is(err, hypervisor.ErrUnavailable) {
		t.Fatalf("Ping without a VMM: %v", err)
	}
}

func TestClientBodyLimit(t *testing.T) {
	ctx := testCtx(t)
	stub, sock := startStub(t)
	c := NewClient(sock)
	if err := c.CreateVM(ctx, fullConfig(filepath.Dir(sock))); err != nil {
		t.Fatal(err)
	}
	stub.mu.Lock()
	stub.infoPad = 2 << 20
	stub.mu.Unlock()
	if _, err := c.Info(ctx); !errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("Info with a 2 MiB body: %v", err)
	}
	small := NewClient(sock)
	small.MaxResponseBytes = 16
	if _, err := small.Ping(ctx); !errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("Ping over a 16-byte limit: %v", err)
	}
	// Error bodies are capped too.
	stub.setFault("/vm.boot", 500, strings.Repeat("e", 64))
	if err := small.BootVM(ctx); !errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("BootVM error body over the limit: %v", err)
	}
}

// silentServer accepts connections and never answers.
func silentServer(t *testing.T) string {
	sock := filepath.Join(shortTempDir(t), "silent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				<-done
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { ln.Close(); close(done) })
	return sock
}

func TestClientDeadline(t *testing.T) {
	sock := silentServer(t)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := NewClient(sock).Info(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("Info against a silent VMM: %v after %v", err, time.Since(start))
	}

	// Without a deadline in ctx, the client's own timeout applies.
	c := NewClient(sock)
	c.Timeout = 200 * time.Millisecond
	start = time.Now()
	if err := c.PauseVM(context.Background()); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("PauseVM without a ctx deadline: %v after %v", err, time.Since(start))
	}

	// The stub's own hang mode: every spec operation honours the deadline.
	stub, sock2 := startStub(t)
	stub.mu.Lock()
	stub.hang = true
	stub.mu.Unlock()
	c2 := NewClient(sock2)
	c2.Timeout, c2.StateTimeout = 100*time.Millisecond, 100*time.Millisecond
	bg := context.Background()
	calls := map[string]func() error{
		"ping":     func() error { _, err := c2.Ping(bg); return err },
		"create":   func() error { return c2.CreateVM(bg, fullConfig("/x")) },
		"snapshot": func() error { return c2.Snapshot(bg, VmSnapshotConfig{DestinationURL: "file:///x"}) },
		"restore":  func() error { return c2.Restore(bg, RestoreConfig{SourceURL: "file:///x"}) },
		"shutdown": func() error { return c2.ShutdownVMM(bg) },
	}
	for name, call := range calls {
		start := time.Now()
		if err := call(); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
			t.Errorf("%s against a hanging stub: %v after %v", name, err, time.Since(start))
		}
	}
}
