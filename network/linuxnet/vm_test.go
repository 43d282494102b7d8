package linuxnet

import (
	"context"
	"encoding/pem"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/backends/qemu"
	"github.com/harebox/harebox/firewall/credproxy"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/network"
)

// TestVMEndToEnd boots the minimal image under QEMU on a real tap: the
// guest agent configures the network from the kernel command line, the
// guest resolves and reaches an allowed test host through the host
// resolver and proxy, and cannot reach a denied one, by name or address.
func TestVMEndToEnd(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it)")
	}
	img := testimage.Image(t, "minimal")
	e := newEnv(t)
	n := e.newNetworkWith("", nil) // real taps
	t.Cleanup(func() { n.Destroy(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	id := "sbx_vm" + suffix()
	att, err := n.Attach(ctx, id, mustPolicy(t, `{"default_outbound":"deny","outbound":[
	  {"action":"allow","hosts":["pypi.org"],"ports":"80"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	guestAddr, gw, _ := n.Addr(id)

	c := bootVM(t, ctx, id, img, att, 256)
	run := func(cmd string) (string, int) {
		t.Helper()
		r, err := c.Exec(ctx, client.ExecRequest{Shell: cmd, User: "root", Timeout: 30 * time.Second}, nil)
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		out := string(r.Stdout) + string(r.Stderr)
		t.Logf("$ %s  (exit %d signal %d timedout %v err %q)\n%s", cmd, r.ExitCode, r.Signal, r.TimedOut, r.Error, out)
		return out, r.ExitCode
	}

	// The agent configured address, route and DNS.
	if out, _ := run("ip -4 addr show; ip route; cat /etc/resolv.conf"); !strings.Contains(out, guestAddr.String()+"/30") ||
		!strings.Contains(out, "default via "+gw.String()) || !strings.Contains(out, "nameserver "+gw.String()) {
		t.Fatalf("guest network not configured from the cmdline")
	}
	// Allowed: by name, through the host resolver and the proxy.
	if out, code := run("nslookup pypi.org"); code != 0 || !strings.Contains(out, pypiIP) {
		t.Errorf("nslookup pypi.org failed")
	}
	// HTTP by address with a Host header, through nc: the image's static
	// busybox wget crashes in glibc's NSS lookups. The Host header is what
	// the proxy sees, as it would be after name resolution.
	wget := func(ip, host string) (string, int) {
		out, code := run(`printf 'GET / HTTP/1.0\r\nHost: ` + host + `\r\n\r\n' | nc -w 8 ` + ip + ` 80`)
		if code == 0 && !strings.Contains(out, "200 OK") {
			code = 1 // connected, then cut by the proxy
		}
		return out, code
	}
	if out, code := wget(pypiIP, "pypi.org"); code != 0 || !strings.Contains(out, "server=pypi.org host=pypi.org") {
		t.Errorf("allowed request failed")
	}
	// Denied: the name does not resolve, its address is refused, and root
	// changing the guest's routes and /etc/hosts changes nothing.
	if _, code := run("nslookup example.com"); code == 0 {
		t.Error("example.com resolved")
	}
	run("ip route add " + exampleIP + "/32 via " + gw.String() + "; echo '" + exampleIP + " example.com' >> /etc/hosts")
	if _, code := wget(exampleIP, "example.com"); code == 0 {
		t.Error("example.com reachable")
	}
	if _, code := wget(exampleIP, exampleIP); code == 0 {
		t.Error("example.com reachable by IP literal")
	}
	if _, code := wget(pypiIP, "example.com"); code == 0 {
		t.Error("example.com reachable with Host example.com to pypi.org's address")
	}
	// The guest believes pypi.org is at example.com's address: the proxy
	// dials pypi.org itself.
	if out, _ := wget(exampleIP, "pypi.org"); !strings.Contains(out, "server=pypi.org") {
		t.Errorf("proxy did not dial pypi.org by name")
	}
	if got := e.count("example.com:80").get(); got != 0 {
		t.Errorf("example.com saw %d connections from the VM", got)
	}
	if _, code := wget(metaIP, metaIP); code == 0 {
		t.Error("metadata reachable")
	}
	// With an allowed Host the proxy goes to pypi.org, not the metadata.
	if out, _ := wget(metaIP, "pypi.org"); !strings.Contains(out, "server=pypi.org") {
		t.Errorf("proxy did not dial pypi.org by name")
	}
	if got := e.count(metaIP + ":80").get(); got != 0 {
		t.Errorf("metadata saw %d connections", got)
	}
}

// vmCredentials gives the Debian VM a credential rule for pypi.org:
// python3 in the guest, as root, sends its placeholder and the test host
// receives the real value, while another host receives the placeholder
// and the guest never sees the value.
func vmCredentials(t *testing.T, ctx context.Context, e *env, n *Network, id string, c *client.Client) {
	if err := n.SetPolicy(ctx, id, mustPolicy(t, `{"default_outbound":"deny","outbound":[
	  {"action":"allow","protocol":"tcp","hosts":["pypi.org","example.com"],"ports":"443"}]}`)); err != nil {
		t.Fatal(err)
	}
	ca, key, err := credproxy.NewCA("HareBox sandbox " + id)
	if err != nil {
		t.Fatal(err)
	}
	const (
		value = "sk-vm-real-value-31415926"
		ph    = "hbph_vmplaceholder0123456789abcdefgh"
	)
	n.SetCredentials(func(sid string) *credproxy.Sandbox {
		if sid != id {
			return nil
		}
		return &credproxy.Sandbox{CA: ca, CAKey: key, Rules: []credproxy.Rule{{
			Hosts: []string{"pypi.org"}, Header: "Authorization", Format: "Bearer {value}", Placeholder: ph, Value: value}}}
	})
	t.Cleanup(func() { n.SetCredentials(func(string) *credproxy.Sandbox { return nil }) })
	// The engine installs the sandbox CA the same way (harebox.installCA).
	bundle := string(e.pems) + string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}))
	if _, err := c.WriteFile(ctx, "/etc/harebox/ca-bundle.pem", strings.NewReader(bundle), client.WriteOptions{Mode: 0o644, MakeParents: true}); err != nil {
		t.Fatal(err)
	}
	script := `
import urllib.request
for host in ("pypi.org", "example.com"):
    req = urllib.request.Request("https://%s/?key=%s" % (host, PH), headers={"Authorization": "Bearer " + PH})
    with urllib.request.urlopen(req, timeout=30) as r:
        print(host, r.status, r.read().decode())
`
	r, err := c.Exec(ctx, client.ExecRequest{Argv: []string{"python3", "-c", "PH = '" + ph + "'\n" + script}, User: "root",
		Env: map[string]string{"SSL_CERT_FILE": "/etc/harebox/ca-bundle.pem"}, Timeout: 90 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := string(r.Stdout) + string(r.Stderr)
	t.Logf("in the guest (exit %d):\n%s", r.ExitCode, out)
	if r.ExitCode != 0 || strings.Contains(out, value) || !strings.Contains(out, "pypi.org 200 server=pypi.org host=pypi.org auth=Bearer "+ph) {
		t.Fatalf("the guest's view: %q", out)
	}
	if got := e.saw("pypi.org"); got != "auth=Bearer "+value+" query=key="+value {
		t.Errorf("pypi.org (the rule's host) received %q", got)
	}
	if got := e.saw("example.com"); got != "auth=Bearer "+ph+" query=key="+ph {
		t.Errorf("example.com (no rule) received %q", got)
	}
}

// TestVMPolicyFromBoot boots the minimal image (its agent is the guest's
// first process and configures its network) under a deny policy given
// before the VM exists, as a create-time policy is, and makes the guest's
// very first command try connections: the denied address sees nothing,
// while an address the policy allows by CIDR answers at the same moment
// (so the probe itself works then). The log says how long after the
// guest's first process started the probe ran (about 2 s under TCG, the
// agent's own start).
func TestVMPolicyFromBoot(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it)")
	}
	img := testimage.Image(t, "minimal")
	e := newEnv(t)
	n := e.newNetworkWith("", nil) // real taps
	t.Cleanup(func() { n.Destroy(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := "sbx_fs" + suffix()
	att, err := n.Attach(ctx, id, mustPolicy(t, `{"default_outbound":"deny","outbound":[
	  {"action":"allow","protocol":"tcp","cidrs":["`+pypiIP+`/32"],"ports":"80"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	launched := time.Now()
	c := bootVM(t, ctx, id, img, att, 256)
	denied, allowed := e.count("example.com:80"), e.count("pypi.org:80")
	// The same request to each address, as fast as the guest can:
	// example.com's first, so it is the earliest packet of all.
	probe := `cut -d' ' -f1 /proc/uptime
for ip in ` + exampleIP + ` ` + pypiIP + `; do
  printf 'GET / HTTP/1.0\r\nHost: x\r\n\r\n' | nc -w 3 $ip 80 | tail -n 1; echo " <- $ip"
done
dmesg | grep -m1 'Run .* as init process'`
	r, err := c.Exec(ctx, client.ExecRequest{Shell: probe, User: "root", Timeout: 30 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := string(r.Stdout)
	t.Logf("%v after launch; the guest's uptime, what each address answered, when its first process started:\n%s%s", time.Since(launched).Round(time.Millisecond), out, r.Stderr)
	if strings.Contains(out, "server=example.com") || denied.get() != 0 {
		t.Errorf("the denied address was reached (%d connections)", denied.get())
	}
	if !strings.Contains(out, "server=pypi.org host=x <- "+pypiIP) || allowed.get() == 0 {
		t.Errorf("the allowed address did not answer: the probe proves nothing")
	}
}

// bootVM boots img under QEMU (one vCPU, memMB) on a real tap of att, its
// root disk (if it has one) behind an overlay, waits for its agent and
// returns a client of it; the VM goes when the test ends.
func bootVM(t *testing.T, ctx context.Context, id string, img images.Image, att *network.Attachment, memMB int) *client.Client {
	t.Helper()
	hv, err := qemu.New(qemu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	spec := hypervisor.Spec{
		ID: id, VCPUs: 1, MemoryMB: memMB, Kernel: img.Kernel, Initrd: img.Initrd,
		Cmdline:  strings.TrimSpace(img.Cmdline + " " + att.Cmdline),
		StateDir: t.TempDir(),
		Network:  &hypervisor.Network{Tap: att.Tap, MAC: att.MAC},
	}
	if img.RootDisk != "" {
		spec.Disks = []hypervisor.Disk{{Path: img.RootDisk, Format: img.RootDiskFormat, Overlay: true}}
	}
	m, err := hv.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Kill(context.Background())
		m.Cleanup(context.Background())
	})
	c, _, err := client.DialReady(ctx, m.AgentEndpoint(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
