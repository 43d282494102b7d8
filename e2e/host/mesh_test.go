package host

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/netcapture"
	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/internal/testpg"
	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/sandbox"
)

// meshPort is the hosts' WireGuard port (each in its own namespace).
const meshPort = 51820

// underlay makes two network namespaces, each a host's, with a veth to
// this one: a at 198.19.251.2 and b at 198.19.251.6, routed here (the hosts'
// routed link). The addresses are a test network's (RFC 2544), outside
// the default mesh pool (10.240.0.0/12): a hareboxd left on this machine
// with its defaults drops what is forwarded into that pool, as it must.
// It returns the namespaces and the name of b's link on
// this side. IPv6 is off on the links: what crosses them is IPv4 or ARP.
func underlay(t testing.TB) (nsA, nsB, linkB string) {
	var id [3]byte
	rand.Read(id[:])
	sfx := fmt.Sprintf("%x", id)
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	for i, side := range []string{"a", "b"} {
		ns, here := "hbm"+side+sfx, "hbu"+side+sfx
		sh("ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		sh("ip", "link", "add", here, "type", "veth", "peer", "name", "eth0", "netns", ns)
		t.Cleanup(func() { exec.Command("ip", "link", "del", here).Run() })
		sh("sysctl", "-qw", "net.ipv6.conf."+here+".disable_ipv6=1")
		sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
		sh("ip", "addr", "add", fmt.Sprintf("198.19.251.%d/30", 4*i+1), "dev", here)
		sh("ip", "link", "set", here, "up")
		sh("ip", "-n", ns, "addr", "add", fmt.Sprintf("198.19.251.%d/30", 4*i+2), "dev", "eth0")
		sh("ip", "-n", ns, "link", "set", "eth0", "up")
		sh("ip", "-n", ns, "link", "set", "lo", "up")
		sh("ip", "-n", ns, "route", "add", "default", "via", fmt.Sprintf("198.19.251.%d", 4*i+1))
		if side == "a" {
			nsA = ns
		} else {
			nsB, linkB = ns, here
		}
	}
	return nsA, nsB, linkB
}

// meshHost is one hareboxd of a meshDeployment.
type meshHost struct {
	name, ns, dir string
	srv           *testserver.Server
	d             *meshDeployment
}

// run runs the CLI against h with the root key.
func (h *meshHost) run(args ...string) (string, string, int) {
	return testserver.RunCLI(h.d.tb, h.d.s, h.srv, "", args...)
}

// ok runs the CLI against h, wants exit 0 and decodes the JSON printed
// into out (if not nil).
func (h *meshHost) ok(out any, args ...string) {
	h.d.tb.Helper()
	o, e, code := h.run(args...)
	if code != 0 {
		h.d.tb.Fatalf("harebox %s (host %s): exit %d: %s%s", strings.Join(args, " "), h.name, code, o, e)
	}
	if out != nil {
		if err := json.Unmarshal([]byte(o), out); err != nil {
			h.d.tb.Fatalf("harebox %s: %v: %s", strings.Join(args, " "), err, o)
		}
	}
}

// meshDeployment is two hareboxd, a and b, each in a network namespace of
// its own (underlay), sharing one PostgreSQL, with their mesh tunnels;
// projects mesh-a and mesh-b have the mesh on.
type meshDeployment struct {
	tb              testing.TB
	s               testserver.Setup
	probe           string
	nsA, nsB, linkB string
	a, b            *meshHost
	made            map[string]*meshHost // sandboxes, by ID
	bDead           bool
}

func newMeshDeployment(tb testing.TB) *meshDeployment {
	if os.Geteuid() != 0 {
		tb.Skip("needs root: network namespaces")
	}
	d := &meshDeployment{tb: tb, s: testserver.Prepare(tb), made: map[string]*meshHost{}}
	d.probe = testimage.Package(tb, "./e2e/testdata/meshprobe", "meshprobe")
	dsn := testpg.ForTest(tb)
	d.nsA, d.nsB, d.linkB = underlay(tb)
	start := func(name, ns, endpoint string, first *meshHost) *meshHost {
		tb.Helper()
		dir, err := os.MkdirTemp("", "hbmh"+name)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { os.RemoveAll(dir) })
		if first != nil {
			// (The deployment's hosts share these keys:
			// docs/several-hosts.md. Each makes its own tunnel key.)
			for _, f := range []string{"root.key", "master.key", "audit.key"} {
				testserver.CopyFile(tb, filepath.Join(first.dir, f), filepath.Join(dir, f))
			}
		}
		h := &meshHost{name: name, ns: ns, dir: dir, d: d}
		h.srv = testserver.StartIn(tb, d.s, dir, ns, "--store", dsn, "--host-name", name, "--host-lease", "3s",
			"--mesh-endpoint", endpoint, "--mesh-pool", "100.72.0.0/21")
		tb.Cleanup(func() {
			if tb.Failed() {
				tb.Logf("host %s's log:\n%s", name, testserver.Tail(h.srv.Log.String()))
			}
		})
		return h
	}
	d.a = start("a", d.nsA, fmt.Sprintf("198.19.251.2:%d", meshPort), nil)
	tb.Cleanup(func() { testserver.Finish(tb, d.a.srv, d.a.dir) })
	d.b = start("b", d.nsB, fmt.Sprintf("198.19.251.6:%d", meshPort), d.a)
	tb.Cleanup(func() {
		if !d.bDead {
			testserver.Finish(tb, d.b.srv, d.b.dir)
		}
	})
	tb.Cleanup(func() { // (before Finish, which wants none left)
		for id, h := range d.made {
			h.run("delete", id)
		}
	})
	tb.Cleanup(func() { // (before the hosts stop)
		if tb.Failed() {
			d.diagnose()
		}
	})
	for _, p := range []string{"mesh-a", "mesh-b"} {
		d.a.ok(nil, "project", "create", p)
		d.a.ok(nil, "project", "update", p, "--mesh")
	}
	return d
}

// diagnose logs what a failed test needs to tell a tunnel that never
// carried a packet from an underlay that lost it: each host's view of
// its tunnels and the router's forwarding and routes.
func (d *meshDeployment) diagnose() {
	for _, h := range []*meshHost{d.a, d.b} {
		if h == d.b && d.bDead {
			continue
		}
		o, e, _ := h.run("mesh", "status")
		d.tb.Logf("host %s: harebox mesh status: %s%s", h.name, o, e)
	}
	fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	routes, _ := exec.Command("ip", "route", "show", "root", "198.19.251.0/24").CombinedOutput()
	d.tb.Logf("the underlay's router: ip_forward %s, routes:\n%s", strings.TrimSpace(string(fwd)), routes)
}

// newBox creates a sandbox on h with the probe serving in it.
func (d *meshDeployment) newBox(h *meshHost, args ...string) sandbox.Sandbox {
	d.tb.Helper()
	var sb sandbox.Sandbox
	h.ok(&sb, append([]string{"new", "--image", "minimal", "--ttl", "900"}, args...)...)
	d.made[sb.ID] = h
	h.ok(nil, "file", "write", sb.ID, "--path", "/tmp/meshprobe", "--mode", "0755", "--from", d.probe)
	h.ok(nil, "exec", sb.ID, "--background", "--", "/tmp/meshprobe", "serve")
	return sb
}

// TestMeshHosts: two hareboxd, each in a network namespace of its own
// with its own underlay address on a routed link, share one PostgreSQL;
// their mesh tunnels (WireGuard in user space) carry project A's mesh
// between them. A1 (host a) and A2 (host b) talk TCP and UDP by name and
// by address; A3 reaches A1 on host a; project B's B1 (mesh on) and a
// sandbox with the mesh off reach none of them and are reached by none,
// nor does B1 as root in its guest with project A's addresses and routes
// of its own. On the underlay, a capture holds WireGuard's UDP only and
// not the probe's canary line. b's key rotated under a running transfer:
// it completes. b killed and started again: the mesh comes back, the
// sandboxes untouched. A2 deleted: its name and address stop at once. b
// removed from the deployment: a drops its tunnel.
func TestMeshHosts(t *testing.T) {
	d := newMeshDeployment(t)
	a, b, nsA, linkB := d.a, d.b, d.nsA, d.linkB
	a1 := d.newBox(a, "--project", "mesh-a", "--name", "a1")
	a2 := d.newBox(b, "--project", "mesh-a", "--name", "a2", "--label", "role=db")
	a3 := d.newBox(a, "--project", "mesh-a", "--name", "a3")
	b1 := d.newBox(a, "--project", "mesh-b", "--name", "b1")
	off := d.newBox(a, "--project", "mesh-a", "--name", "off", "--mesh=false")
	if a1.Host != "a" || a2.Host != "b" || a2.MeshName != "a2.mesh-a.internal" || a2.MeshAddress == "" || off.MeshAddress != "" {
		t.Fatalf("placed and addressed: a1 %+v, a2 %+v, off %+v", a1, a2, off)
	}
	try := func(from sandbox.Sandbox, proto, to, wait string) (bool, string) {
		t.Helper()
		o, e, code := d.made[from.ID].run("exec", from.ID, "--", "/tmp/meshprobe", "echo", proto, to, wait)
		return code == 0 && strings.TrimSpace(o) == "ok", o + e
	}
	echo := func(from sandbox.Sandbox, proto, to string) (bool, string) { return try(from, proto, to, "10s") }
	blocked := func(from sandbox.Sandbox, proto, to string) bool {
		ok, _ := try(from, proto, to, "1s")
		return !ok
	}

	t.Run("across the hosts, by name and address; nobody else", func(t *testing.T) {
		capture := netcapture.Start(t, "", linkB)
		for _, proto := range []string{"tcp", "udp"} {
			for _, to := range []string{a2.MeshName, a2.MeshAddress} {
				if ok, out := echo(a1, proto, to); !ok {
					t.Errorf("a1 to a2 at %s over %s: %s", to, proto, out)
				}
			}
			if ok, out := echo(a2, proto, a1.MeshName); !ok {
				t.Errorf("a2 to a1 over %s: %s", proto, out)
			}
		}
		n, err := netcapture.UDPOnly(capture.Stop(), []byte("mesh canary"), meshPort)
		if err != nil || n == 0 {
			t.Errorf("on the underlay: %v (%d WireGuard datagrams)", err, n)
		}
		if ok, out := echo(a3, "tcp", a1.MeshName); !ok {
			t.Errorf("a3 to a1 on host a: %s", out)
		}
		for _, c := range []struct {
			what     string
			from     sandbox.Sandbox
			to       string
			protocol string
		}{
			{"project B's b1 to a2", b1, a2.MeshAddress, "tcp"},
			{"project B's b1 to a2 by name", b1, a2.MeshName, "udp"},
			{"a2 to project B's b1", a2, b1.MeshAddress, "tcp"},
			{"a2 to project B's b1 by name", a2, b1.MeshName, "udp"},
			{"the one off the mesh to a2", off, a2.MeshAddress, "tcp"},
			{"a2 to host a's underlay address", a2, "198.19.251.2", "tcp"},
		} {
			if !blocked(c.from, c.protocol, c.to) {
				t.Errorf("%s over %s: got through", c.what, c.protocol)
			}
		}
	})
	t.Run("root in a guest", func(t *testing.T) {
		// b1 takes a3's address and a2's neighbour's, with a route to a2
		// from each, and changes its MAC.
		spoof := a2.MeshAddress[:strings.LastIndex(a2.MeshAddress, ".")] + ".200"
		a.ok(nil, "exec", b1.ID, "--user", "root", "--", "sh", "-c",
			"ip link set eth0 down && ip link set eth0 address 02:00:00:00:00:99 && ip link set eth0 up && "+
				"ip addr add "+spoof+"/32 dev eth0 && ip addr add "+a3.MeshAddress+"/32 dev eth0 && "+
				"ip route replace "+a2.MeshAddress+"/32 dev eth0 src "+spoof)
		for _, proto := range []string{"tcp", "udp"} {
			if !blocked(b1, proto, a2.MeshAddress) {
				t.Errorf("b1 as %s to a2 over %s: got through", spoof, proto)
			}
		}
		a.ok(nil, "exec", b1.ID, "--user", "root", "--", "ip", "route", "replace", a2.MeshAddress+"/32", "dev", "eth0", "src", a3.MeshAddress)
		if !blocked(b1, "tcp", a2.MeshAddress) {
			t.Errorf("b1 as a3 (%s) to a2: got through", a3.MeshAddress)
		}
		// b1 announces a3's address as its own (gratuitous ARP): a3 is
		// still the one a1 reaches there (the host pins a3's MAC).
		a.ok(nil, "exec", b1.ID, "--user", "root", "--", "arping", "-U", "-c", "3", "-w", "1", "-I", "eth0", "-s", a3.MeshAddress, a3.MeshAddress)
		if ok, out := echo(a1, "tcp", a3.MeshAddress); !ok {
			t.Errorf("a1 to a3 after b1's ARP: %s", out)
		}
	})

	t.Run("mesh rules, and the project's default", func(t *testing.T) {
		// The project denies by default; a3 may open TCP to port 7007 of
		// its sandboxes labelled role=db (a2, on the other host).
		a.ok(nil, "project", "update", "mesh-a", "--mesh-default", "deny")
		a.ok(nil, "firewall", "set", a3.ID, "--body",
			`{"default_outbound":"allow","mesh":[{"action":"allow","protocol":"tcp","ports":"7007","labels":{"role":"db"}}]}`)
		// (The hosts take the default on the store's notice: a moment.)
		for end := time.Now().Add(10 * time.Second); !blocked(a1, "tcp", a2.MeshName); time.Sleep(200 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal("a1 still reaches a2 with the project's default deny")
			}
		}
		if ok, out := echo(a3, "tcp", a2.MeshName); !ok {
			t.Errorf("a3 to a2 over tcp, allowed by its rule: %s", out)
		}
		for _, c := range []struct {
			what, proto string
			from        sandbox.Sandbox
			to          string
		}{
			{"a3 to a2 over udp", "udp", a3, a2.MeshName},
			{"a3 to a1", "tcp", a3, a1.MeshName},
			{"a2 to a1", "tcp", a2, a1.MeshName},
		} {
			if !blocked(c.from, c.proto, c.to) {
				t.Errorf("%s, denied by default: got through", c.what)
			}
		}
		a.ok(nil, "project", "update", "mesh-a", "--mesh-default", "allow")
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if ok, _ := try(a1, "tcp", a2.MeshName, "1s"); ok {
				break
			}
			if time.Now().After(end) {
				t.Fatal("a1 does not reach a2 again with the project's default allow")
			}
		}
	})

	type hosts struct {
		Hosts []struct {
			Name string
			Mesh *struct {
				PublicKey string `json:"public_key"`
				Endpoint  string
				Tunnels   []struct {
					Host          string
					LastHandshake time.Time `json:"last_handshake"`
					RxBytes       uint64    `json:"rx_bytes"`
				}
			}
		}
	}
	meshOf := func(name string) (key string, tunnels []string) {
		t.Helper()
		var hs hosts
		a.ok(&hs, "mesh", "status")
		for _, h := range hs.Hosts {
			if h.Name == name && h.Mesh != nil {
				for _, tu := range h.Mesh.Tunnels {
					tunnels = append(tunnels, tu.Host)
				}
				return h.Mesh.PublicKey, tunnels
			}
		}
		return "", nil
	}
	t.Run("b's key rotated under a running transfer", func(t *testing.T) {
		before, _ := meshOf("b")
		done := make(chan string, 1)
		go func() {
			o, e, code := a.run("exec", a1.ID, "--", "/tmp/meshprobe", "bench", a2.MeshName, "256")
			done <- fmt.Sprintf("%d %s%s", code, o, e)
		}()
		time.Sleep(time.Second)
		a.ok(nil, "mesh", "rotate-key", "b")
		rotated := false
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			if after, _ := meshOf("b"); after != before && after != "" {
				rotated = true
				break
			}
		}
		select {
		case out := <-done:
			t.Fatalf("the transfer ended before b's key changed (rotated %v): %s", rotated, out)
		default:
		}
		if !rotated {
			t.Fatal("b did not publish a new key")
		}
		out := <-done
		if !strings.HasPrefix(out, "0 {") {
			t.Fatalf("the transfer across the rotation: %s", out)
		}
		t.Logf("256 MiB across the rotation: %s", out)
		if ok, out := echo(a1, "udp", a2.MeshName); !ok {
			t.Errorf("a1 to a2 after the rotation: %s", out)
		}
	})
	t.Run("b killed and started again", func(t *testing.T) {
		b.srv.Cmd.Process.Signal(syscall.SIGKILL)
		b.srv.Cmd.Wait()
		testserver.Relaunch(t, b.srv)
		// (a2's probe server was not started again: the sandbox ran on.)
		for _, proto := range []string{"tcp", "udp"} {
			if ok, out := echo(a1, proto, a2.MeshName); !ok {
				t.Errorf("a1 to a2 over %s after b's restart: %s", proto, out)
			}
		}
		if !blocked(b1, "tcp", a2.MeshAddress) {
			t.Error("project B reached a2 after b's restart")
		}
		if _, tunnels := meshOf("a"); len(tunnels) != 1 || tunnels[0] != "b" {
			t.Errorf("a's tunnels: %v", tunnels)
		}
	})
	t.Run("a deleted sandbox, at once", func(t *testing.T) {
		b.ok(nil, "delete", a2.ID)
		for _, to := range []string{a2.MeshName, a2.MeshAddress} {
			if !blocked(a1, "tcp", to) {
				t.Errorf("a1 to the deleted a2 at %s: got through", to)
			}
		}
	})
	t.Run("b removed", func(t *testing.T) {
		b.srv.Cmd.Process.Signal(syscall.SIGKILL)
		b.srv.Cmd.Wait()
		d.bDead = true
		testserver.NoLeftovers(t, b.dir)
		// (Refused until b's lease lapses.)
		for end := time.Now().Add(15 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			if _, _, code := a.run("hosts", "remove", "b"); code == 0 {
				break
			}
			if time.Now().After(end) {
				t.Fatal("b could not be removed")
			}
		}
		for end := time.Now().Add(5 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			out, _ := exec.Command("ip", "-n", nsA, "route", "show", "dev", "hb-mesh").CombinedOutput()
			if _, tunnels := meshOf("a"); len(tunnels) == 0 && strings.TrimSpace(string(out)) == "" {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("a kept b: routes %q", out)
			}
		}
	})
}
