// Command bootvm is the `make demo` walkthrough at the hypervisor level: it
// starts the QEMU backend as a plugin, boots a real VM from the minimal
// image, runs untrusted code in it through the guest agent (as an
// unprivileged user, with a timeout), forks it with snapshot/restore and
// fresh entropy, and cleans everything up. It prints a transcript.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/plugin"
	"github.com/harebox/harebox/images"
)

const job = `#!/bin/sh
# An untrusted job: it reports who it is and tries things it must not do.
echo "job running as $(id -un) (uid $(id -u)) on kernel $(uname -r)"
echo "sum of 1..100000: $(seq 100000 | awk '{s+=$1} END {print s}')"
echo "trying to write /etc/passwd:"; echo evil >> /etc/passwd 2>&1 || echo "  denied"
echo "spinning forever (the host's timeout will stop it)..."
while :; do :; done
`

func main() {
	imagePath := flag.String("image", "", "image manifest (JSON from harebox-image build)")
	pluginPath := flag.String("plugin", "bin/harebox-plugin-qemu", "QEMU backend plugin binary")
	flag.Parse()
	if err := run(*imagePath, *pluginPath); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

func run(imagePath, pluginPath string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b, err := os.ReadFile(imagePath)
	if err != nil {
		return err
	}
	var img images.Image
	if err := json.Unmarshal(b, &img); err != nil {
		return fmt.Errorf("image manifest: %w", err)
	}
	dir, err := os.MkdirTemp("", "hbdemo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	step("starting the QEMU backend plugin %s", pluginPath)
	hv, err := plugin.Launch(ctx, pluginPath, nil, "", slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return err
	}
	defer hv.Close()
	caps, err := hv.Capabilities(ctx)
	if err != nil {
		return err
	}
	step("backend %s %s, accelerator %s", caps.Name, caps.Version, caps.Accelerator)
	if caps.Notice != "" {
		fmt.Println("    note:", caps.Notice)
	}

	spec := hypervisor.Spec{
		ID: "demo", VCPUs: 1, MemoryMB: 256, StateDir: filepath.Join(dir, "demo"),
		Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: img.Cmdline,
	}
	start := time.Now()
	m, err := hv.Launch(ctx, spec)
	if err != nil {
		return err
	}
	var machines = []hypervisor.Machine{m}
	defer func() {
		for _, m := range machines {
			m.Kill(context.Background())
			m.Cleanup(context.Background())
		}
	}()
	agent, err := dialReady(ctx, m)
	if err != nil {
		return err
	}
	defer agent.Close()
	h, _ := agent.Health(ctx)
	step("VM %s booted, agent %s healthy after %v (kernel %s)", m.ID(), h.Version, time.Since(start).Round(time.Millisecond), h.Kernel)

	step("writing the untrusted job to /home/user/job.sh")
	if _, err := agent.WriteFile(ctx, "/home/user/job.sh", strings.NewReader(job), agentclient.WriteOptions{Mode: 0o755}); err != nil {
		return err
	}
	step("running it as the unprivileged user with a 5 s timeout")
	r, err := agent.Exec(ctx, agentclient.ExecRequest{Argv: []string{"/home/user/job.sh"}, Timeout: 5 * time.Second}, nil)
	if err != nil {
		return err
	}
	fmt.Print(indent(r.Stdout), indent(r.Stderr))
	step("exit code %d, timed out: %v, after %v", r.ExitCode, r.TimedOut, r.Duration.Round(time.Millisecond))

	step("forking the VM: snapshot, then restore into a clone")
	snap := filepath.Join(dir, "snap")
	if err := m.Snapshot(ctx, snap, nil); err != nil {
		return err
	}
	if err := m.Resume(ctx); err != nil {
		return err
	}
	start = time.Now()
	clone, err := hv.Restore(ctx, snap, hypervisor.Spec{ID: "demo-clone", StateDir: filepath.Join(dir, "clone")})
	if err != nil {
		return err
	}
	machines = append(machines, clone)
	cagent, err := dialReady(ctx, clone)
	if err != nil {
		return err
	}
	defer cagent.Close()
	id := make([]byte, 16)
	rand.Read(id)
	entropy := make([]byte, 64)
	rand.Read(entropy)
	if err := cagent.Reseed(ctx, entropy, hex.EncodeToString(id), "clone"); err != nil {
		return err
	}
	step("clone answered after %v; reseeded with fresh entropy and machine-id %x", time.Since(start).Round(time.Millisecond), id)
	var got bytes.Buffer
	if _, err := cagent.ReadFile(ctx, "/home/user/job.sh", &got, 0, 1<<20); err != nil {
		return err
	}
	step("the clone has the job file from before the fork (%d bytes)", got.Len())

	step("shutting both VMs down and removing their files")
	for _, mm := range machines {
		sctx, scancel := context.WithTimeout(ctx, 60*time.Second)
		err := mm.Shutdown(sctx)
		scancel()
		if err != nil {
			return err
		}
		if err := mm.Cleanup(ctx); err != nil {
			return err
		}
	}
	machines = nil
	step("done: no VMs, sockets or disks left behind")
	return nil
}

func dialReady(ctx context.Context, m hypervisor.Machine) (*agentclient.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, _, err := agentclient.DialReady(ctx, m.AgentEndpoint(), agentclient.Options{})
	return c, err
}

func indent(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(string(b), "\n"), "\n", "\n    ") + "\n"
}
