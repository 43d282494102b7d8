package e2e

import (
	"strings"
	"syscall"
	"testing"

	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/sandbox"
)

// TestMesh turns the mesh on for two projects with the CLI and runs real
// VMs on it behind the host firewall: a project's sandboxes reach each
// other by name and by address, over TCP and UDP; another project's
// sandbox and one kept off the mesh reach none of them and are reached by
// none; as root in a guest, neither a spoofed source address nor a route
// of its own gets through; hareboxd killed and started again changes
// none of it; a deleted sandbox's name stops resolving and its address
// answers no more, at once.
func TestMesh(t *testing.T) {
	// (Beside TestCLIAudit, at the end of the package: its VMs' boots
	// and the other's CLI runs share the cores.)
	t.Parallel()
	s := testserver.Prepare(t)
	probe := testimage.Package(t, "./e2e/testdata/meshprobe", "meshprobe")
	// A warm pool of one: creates are claimed from it as well as restored
	// from the golden snapshot, and a claimed member joins the mesh too.
	cli := testserver.StartCLI(t, s, "hbmesh", "--pool", "minimal:small=1")
	srv := cli.Srv

	for _, p := range []string{"mesh-a", "mesh-b"} {
		cli.OK("", nil, "project", "create", p)
		var proj struct{ Mesh bool }
		if cli.OK("", &proj, "project", "update", p, "--mesh"); !proj.Mesh {
			t.Fatalf("project %s: mesh not on", p)
		}
	}
	newBox := func(args ...string) sandbox.Sandbox {
		t.Helper()
		var b sandbox.Sandbox
		cli.OK("", &b, append([]string{"new", "--image", "minimal", "--ttl", "900"}, args...)...)
		cli.Made(b.ID)
		cli.OK("", nil, "file", "write", b.ID, "--path", "/tmp/meshprobe", "--mode", "0755", "--from", probe)
		cli.OK("", nil, "exec", b.ID, "--background", "--", "/tmp/meshprobe", "serve")
		return b
	}
	web := newBox("--project", "mesh-a", "--name", "web")
	worker := newBox("--project", "mesh-a")
	other := newBox("--project", "mesh-b", "--name", "db")
	off := newBox("--project", "mesh-a", "--name", "off", "--mesh=false")

	if web.MeshAddress == "" || web.MeshName != "web.mesh-a.internal" || worker.MeshAddress == "" ||
		worker.MeshName != strings.ReplaceAll(worker.ID, "_", "-")+".mesh-a.internal" {
		t.Fatalf("mesh addresses and names: %+v / %+v", web, worker)
	}
	if other.MeshAddress == "" || other.MeshName != "db.mesh-b.internal" || strings.HasPrefix(other.MeshAddress, web.MeshAddress[:strings.LastIndex(web.MeshAddress, ".")]) {
		t.Errorf("project b's db: %s %s, in project a's range (%s)?", other.MeshAddress, other.MeshName, web.MeshAddress)
	}
	if off.MeshAddress != "" || off.MeshName != "" {
		t.Errorf("a sandbox kept off the mesh: %s %s", off.MeshAddress, off.MeshName)
	}
	t.Logf("served: web %s, worker %s, other %s, off %s", web.Served, worker.Served, other.Served, off.Served)

	// echo runs the probe in from against host; it reports whether the
	// line came back (within 10 s). blocked says it did not within 1 s:
	// what must not get through is given less time (a loopback's round
	// trip many times over, between two guests on this host).
	try := func(from sandbox.Sandbox, proto, host, wait string) (bool, string) {
		t.Helper()
		o, e, code := cli.Run("", "exec", from.ID, "--", "/tmp/meshprobe", "echo", proto, host, wait)
		return code == 0 && strings.TrimSpace(o) == "ok", o + e
	}
	echo := func(from sandbox.Sandbox, proto, host string) (bool, string) { return try(from, proto, host, "10s") }
	blocked := func(from sandbox.Sandbox, proto, host string) bool {
		ok, _ := try(from, proto, host, "1s")
		return !ok
	}
	t.Run("a project's sandboxes, by name and address", func(t *testing.T) {
		for _, proto := range []string{"tcp", "udp"} {
			for _, host := range []string{"web.mesh-a.internal", web.MeshAddress} {
				if ok, out := echo(worker, proto, host); !ok {
					t.Errorf("worker to %s over %s: %s", host, proto, out)
				}
			}
			if ok, out := echo(web, proto, worker.MeshName); !ok {
				t.Errorf("web to %s over %s: %s", worker.MeshName, proto, out)
			}
			// (Project b's one has its address and name, however it was
			// served: a claimed pool member is given them as it is.)
			if ok, out := echo(other, proto, other.MeshName); !ok {
				t.Errorf("project b's db to its own name over %s: %s", proto, out)
			}
		}
	})
	t.Run("a fork joins with its own address and name", func(t *testing.T) {
		var clone sandbox.Sandbox // (one clone: the CLI prints it alone)
		cli.OK("", &clone, "fork", worker.ID)
		cli.Made(clone.ID)
		if clone.MeshAddress == "" || clone.MeshAddress == worker.MeshAddress || clone.MeshName != strings.ReplaceAll(clone.ID, "_", "-")+".mesh-a.internal" {
			t.Fatalf("the clone's mesh: %s %s (its source's %s)", clone.MeshAddress, clone.MeshName, worker.MeshAddress)
		}
		// (Its probe server was forked running.)
		for _, host := range []string{clone.MeshName, clone.MeshAddress} {
			if ok, out := echo(web, "tcp", host); !ok {
				t.Errorf("web to the clone at %s: %s", host, out)
			}
		}
		// The clone holds its own address only: its source's answers
		// from the source.
		o, _, _ := cli.Run("", "exec", clone.ID, "--", "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		if strings.Contains(o, worker.MeshAddress+"/") || !strings.Contains(o, clone.MeshAddress+"/") {
			t.Errorf("the clone's addresses: %s", o)
		}
		if ok, out := echo(web, "tcp", worker.MeshName); !ok {
			t.Errorf("web to the fork's source: %s", out)
		}
	})
	t.Run("nobody else", func(t *testing.T) {
		for _, c := range []struct {
			what string
			from sandbox.Sandbox
			host string
		}{
			{"project b to project a's web", other, web.MeshAddress},
			{"project b to a name of project a", other, "web.mesh-a.internal"},
			{"the one off the mesh to web", off, web.MeshAddress},
			{"the one off the mesh by name", off, "web.mesh-a.internal"},
			{"web to project b's db", web, other.MeshAddress},
			{"web to project b's db by name", web, "db.mesh-b.internal"},
		} {
			for _, proto := range []string{"tcp", "udp"} {
				if !blocked(c.from, proto, c.host) {
					t.Errorf("%s over %s: got through", c.what, proto)
				}
			}
		}
	})
	t.Run("root in a guest", func(t *testing.T) {
		// Project b's sandbox takes an address of project a's range and
		// routes that range itself; the one off the mesh takes web's
		// neighbour's address.
		spoof := web.MeshAddress[:strings.LastIndex(web.MeshAddress, ".")] + ".200"
		for _, b := range []sandbox.Sandbox{other, off} {
			cli.OK("", nil, "exec", b.ID, "--user", "root", "--", "sh", "-c",
				"ip addr add "+spoof+"/32 dev eth0 && ip route replace "+web.MeshAddress+"/32 dev eth0 src "+spoof)
			for _, proto := range []string{"tcp", "udp"} {
				if !blocked(b, proto, web.MeshAddress) {
					t.Errorf("%s as %s to web over %s: got through", b.Name, spoof, proto)
				}
			}
		}
	})
	t.Run("hareboxd killed and started again", func(t *testing.T) {
		// The VMs, taps and rules outlive it; the resolver is back with
		// the names, and the rules as they were.
		srv.Cmd.Process.Signal(syscall.SIGKILL)
		srv.Cmd.Wait()
		testserver.Relaunch(t, srv)
		for _, host := range []string{"web.mesh-a.internal", web.MeshAddress} {
			if ok, out := echo(worker, "udp", host); !ok {
				t.Errorf("worker to web at %s after a restart: %s", host, out)
			}
		}
		if !blocked(other, "tcp", web.MeshAddress) {
			t.Error("project b reached web after a restart")
		}
	})
	t.Run("deleted at once", func(t *testing.T) {
		cli.OK("", nil, "delete", web.ID)
		for _, host := range []string{"web.mesh-a.internal", web.MeshAddress} {
			if !blocked(worker, "tcp", host) {
				t.Errorf("worker to the deleted web at %s: got through", host)
			}
		}
		if ok, out := echo(worker, "tcp", worker.MeshName); !ok {
			t.Errorf("worker to itself by name: %s", out)
		}
	})
}
