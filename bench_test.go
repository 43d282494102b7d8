package harebox_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/backends/qemu"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/sandbox"
)

// The benchmarks measure the engine against the bare parts it is built
// on, in the same run, and report the ratio (make bench).

func benchEnv(b *testing.B) (*env, func()) {
	b.Helper()
	if _, err := os.Stat("/usr/bin/qemu-system-x86_64"); err != nil {
		b.Skip("qemu-system-x86_64 is not installed")
	}
	dir, err := os.MkdirTemp("", "hbb")
	if err != nil {
		b.Fatal(err)
	}
	v := &env{dataDir: dir, plugin: testimage.Binary(b, "harebox-plugin-qemu"), img: testimage.Image(b, "minimal")}
	return v, func() { strayVMs(dir); os.RemoveAll(dir) }
}

// bareBoot launches the image with the backend alone and waits for the agent.
func bareBoot(b *testing.B, hv hypervisor.Hypervisor, img images.Image, dir string, i int) (hypervisor.Machine, *agentclient.Client) {
	spec := hypervisor.Spec{
		ID: "bare" + strconv.Itoa(i), VCPUs: 1, MemoryMB: 512, StateDir: filepath.Join(dir, "bare"+strconv.Itoa(i)),
		Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: img.Cmdline,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m, err := hv.Launch(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	c, _, err := agentclient.DialReady(ctx, m.AgentEndpoint(), agentclient.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return m, c
}

func bareStop(m hypervisor.Machine, c *agentclient.Client) {
	c.Close()
	m.Kill(context.Background())
	m.Cleanup(context.Background())
}

// BenchmarkCreateToReady: engine Create (admission, records, plugin,
// network, boot, agent ready, time sync) next to a bare backend launch of
// the same image until its agent answers.
func BenchmarkCreateToReady(b *testing.B) {
	v, done := benchEnv(b)
	defer done()
	eng := v.open(b)
	defer eng.Close()
	hv, err := qemu.New(qemu.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var engine, bare time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		box, err := eng.Create(ctx, sandbox.CreateRequest{Image: "minimal"})
		if err != nil {
			b.Fatal(err)
		}
		engine += time.Since(start)
		eng.Delete(ctx, box.ID)

		start = time.Now()
		m, c := bareBoot(b, hv, v.img, v.dataDir, i)
		bare += time.Since(start)
		bareStop(m, c)
	}
	b.ReportMetric(engine.Seconds()/float64(b.N), "engine-s/op")
	b.ReportMetric(bare.Seconds()/float64(b.N), "bare-s/op")
	b.ReportMetric(float64(engine)/float64(bare), "engine/bare")
}

// BenchmarkExecRoundTrip: one short command through the engine next to
// the same command through the agent client directly.
func BenchmarkExecRoundTrip(b *testing.B) {
	v, done := benchEnv(b)
	defer done()
	eng := v.open(b)
	defer eng.Close()
	ctx := context.Background()
	box, err := eng.Create(ctx, sandbox.CreateRequest{Image: "minimal"})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Delete(ctx, box.ID)
	hv, err := qemu.New(qemu.Options{})
	if err != nil {
		b.Fatal(err)
	}
	m, c := bareBoot(b, hv, v.img, v.dataDir, 0)
	defer bareStop(m, c)

	var engine, direct time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		engine += time.Since(start)
		start = time.Now()
		if _, err := c.Exec(ctx, agentclient.ExecRequest{Argv: []string{"true"}}, nil); err != nil {
			b.Fatal(err)
		}
		direct += time.Since(start)
	}
	b.ReportMetric(float64(engine.Microseconds())/float64(b.N), "engine-us/op")
	b.ReportMetric(float64(direct.Microseconds())/float64(b.N), "direct-us/op")
	b.ReportMetric(float64(engine)/float64(direct), "engine/direct")
}
