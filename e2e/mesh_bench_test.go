package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/sandbox"
)

// BenchmarkMesh: two sandboxes of one project on one host, over their
// mesh, against the same probe over the host's loopback, in one run: the
// p50 of 200 one-byte TCP round trips, and 64 MiB sent over TCP. (b.N is
// ignored: one pass.)
func BenchmarkMesh(b *testing.B) {
	s := testserver.Prepare(b)
	probe := testimage.Package(b, "./e2e/testdata/meshprobe", "meshprobe")
	dataDir, err := os.MkdirTemp("", "hbmeshb")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.Start(b, s, dataDir)
	defer testserver.Finish(b, srv, dataDir)
	hb := func(args ...string) string {
		b.Helper()
		o, e, code := testserver.RunCLI(b, s, srv, "", args...)
		if code != 0 {
			b.Fatalf("harebox %s: exit %d: %s", strings.Join(args, " "), code, e)
		}
		return o
	}
	var made []string
	defer func() { // (before Finish)
		for _, id := range made {
			testserver.RunCLI(b, s, srv, "", "delete", id)
		}
	}()
	hb("project", "create", "bench")
	hb("project", "update", "bench", "--mesh")
	var boxes [2]sandbox.Sandbox
	for i := range boxes {
		if err := json.Unmarshal([]byte(hb("new", "--image", "minimal", "--project", "bench", "--ttl", "900")), &boxes[i]); err != nil {
			b.Fatal(err)
		}
		made = append(made, boxes[i].ID)
		hb("file", "write", boxes[i].ID, "--path", "/tmp/meshprobe", "--mode", "0755", "--from", probe)
	}
	hb("exec", boxes[0].ID, "--background", "--", "/tmp/meshprobe", "serve")
	time.Sleep(time.Second)

	parse := func(what, out string) testserver.ProbeBench { return testserver.ParseProbeBench(b, what, out) }
	const mib = "64"
	mesh := parse("over the mesh", hb("exec", boxes[1].ID, "--", "/tmp/meshprobe", "bench", boxes[0].MeshName, mib))

	serve := exec.Command(probe, "serve")
	if err := serve.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { serve.Process.Kill(); serve.Wait() }()
	time.Sleep(300 * time.Millisecond)
	out, err := exec.Command(probe, "bench", "127.0.0.1", mib).Output()
	if err != nil {
		b.Fatal("on the host's loopback:", err)
	}
	loop := parse("on the host's loopback", string(out))

	mesh.Report(b, "mesh", loop, "loopback")
}
