package host

import (
	"os/exec"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testserver"
)

// BenchmarkMeshHosts: two sandboxes of one project on two hosts, over
// the mesh (through both hosts' WireGuard tunnels, in user space),
// against the same probe run between the two hosts' namespaces directly
// (their underlay addresses, no tunnel), in one run: the p50 of 200
// one-byte TCP round trips, and 64 MiB sent over TCP. (b.N is ignored:
// one pass.)
func BenchmarkMeshHosts(b *testing.B) {
	d := newMeshDeployment(b)
	a1 := d.newBox(d.a, "--project", "mesh-a")
	a2 := d.newBox(d.b, "--project", "mesh-a")
	parse := func(what, out string) testserver.ProbeBench { return testserver.ParseProbeBench(b, what, out) }
	const mib = "64"
	o, e, code := d.a.run("exec", a1.ID, "--", "/tmp/meshprobe", "bench", a2.MeshName, mib)
	if code != 0 {
		b.Fatalf("over the mesh: %s%s", o, e)
	}
	mesh := parse("over the mesh", o)

	serve := exec.Command("ip", "netns", "exec", d.nsB, d.probe, "serve")
	if err := serve.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { serve.Process.Kill(); serve.Wait() }()
	time.Sleep(300 * time.Millisecond)
	out, err := exec.Command("ip", "netns", "exec", d.nsA, d.probe, "bench", "198.19.251.6", mib).Output()
	if err != nil {
		b.Fatal("between the hosts' namespaces:", err)
	}
	direct := parse("between the hosts' namespaces", string(out))

	mesh.Report(b, "mesh", direct, "direct")
}
