package main

import (
	"bytes"
	"flag"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/clone"
)

func TestDoctor(t *testing.T) {
	var out, errOut bytes.Buffer
	imageDir := t.TempDir()
	code := doctorCmd([]string{"--data-dir", t.TempDir(), "--image-dir", imageDir}, &out, &errOut)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "qemu: ") || !strings.HasPrefix(lines[1], "cloud-hypervisor: ") {
		t.Fatalf("doctor output:\n%s%s", out.String(), errOut.String())
	}
	// No image built: missing, with how to build one, and exit 1.
	if !strings.Contains(out.String(), "images: missing: no image in "+imageDir+": build one with harebox-image build") || code != 1 {
		t.Errorf("doctor without images: exit %d\n%s", code, out.String())
	}
	// (This host runs the tests as root with nftables and tun.)
	for _, want := range []string{"qemu-img: ok", "data-dir: ok", "tun: ok", "nftables: ok", "forwarding: ok", "address-pools: ok"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out.String())
		}
	}
	// Bad settings are refused as a start refuses them.
	if code := doctorCmd([]string{"--network", "bridge"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "--network") {
		t.Errorf("bad settings: %d %s", code, errOut.String())
	}
	_, qemuErr := exec.LookPath("qemu-system-x86_64")
	if (qemuErr == nil) != strings.HasPrefix(lines[0], "qemu: ok") {
		t.Errorf("qemu line %q disagrees with PATH (%v)", lines[0], qemuErr)
	}
	for _, l := range lines {
		if strings.Contains(l, "cannot run") && len(strings.SplitN(l, "cannot run: ", 2)[1]) < 10 {
			t.Errorf("no reason given: %q", l)
		}
	}
	if qemuErr == nil && strings.Contains(out.String(), "qemu: missing") {
		t.Errorf("qemu missing with it on PATH")
	}
}

func TestListenerLoopbackOnlyWithoutTLS(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:7070", "10.1.2.3:7070", ":7070", "example.com:7070"} {
		if l, err := listener(addr, false); err == nil {
			l.Close()
			t.Errorf("%s: listening beyond loopback in plain HTTP", addr)
		} else if !strings.Contains(err.Error(), "--tls-self-signed") {
			t.Errorf("%s: the refusal does not say how to serve there: %v", addr, err)
		}
	}
	// With TLS, any address.
	l, err := listener("0.0.0.0:0", true)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	l, err = listener("127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err = listener("unix:"+sock, false)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
}

func TestDefaultFirewallFlag(t *testing.T) {
	for v, want := range map[string]string{"public": "allow", "deny": "deny"} {
		p, err := defaultFirewall(v)
		if err != nil || string(p.DefaultOutbound) != want {
			t.Errorf("%s: %+v %v", v, p, err)
		}
	}
	f := filepath.Join(t.TempDir(), "p.json")
	os.WriteFile(f, []byte(`{"default_outbound": "deny", "outbound": [{"action": "allow", "protocol": "tcp", "ports": "443", "hosts": ["pypi.org"]}]}`), 0o644)
	if p, err := defaultFirewall("@" + f); err != nil || len(p.Outbound) != 1 {
		t.Errorf("@file: %+v %v", p, err)
	}
	os.WriteFile(f, []byte(`{"default_outbound": "sometimes"}`), 0o644)
	for _, v := range []string{"@" + f, "@/no/such/file", "open", ""} {
		if _, err := defaultFirewall(v); err == nil {
			t.Errorf("%q accepted", v)
		}
	}
}

func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "hareboxd.yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	newFlags := func() (*flag.FlagSet, *string, *time.Duration, *bool) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		return fs, fs.String("listen", "127.0.0.1:7070", ""), fs.Duration("meter-interval", 5*time.Second, ""), fs.Bool("debug", false, "")
	}
	fs, listen, meter, debug := newFlags()
	fs.Parse([]string{"--listen", "127.0.0.1:9"})
	if err := applyConfig(fs, write("# settings\nlisten: 0.0.0.0:7443\nmeter-interval: 10s\ndebug: true\n")); err != nil {
		t.Fatal(err)
	}
	if *listen != "127.0.0.1:9" || *meter != 10*time.Second || !*debug {
		t.Fatalf("listen %s (the command line wins), meter %v, debug %v", *listen, *meter, *debug)
	}
	for body, want := range map[string]string{
		"listne: 0.0.0.0:7443\n":                `line 1: "listne": unknown setting`,
		"debug: true\nmeter-interval: fast\n":   `line 2: "meter-interval": invalid value "fast"`,
		"listen:\n  host: x\n":                  `line 1: "listen": want one value`,
		"debug: true\ndebug: false\n":           `line 2: "debug": given twice`,
		"config: other.yaml\n":                  `"config": a config file cannot name another`,
		"- listen\n":                            "want a mapping",
		"listen: [\n":                           "yaml",
		"debug: true\n---\nlisten: 0.0.0.0:1\n": "one document only",
	} {
		fs, _, _, _ := newFlags()
		fs.String("config", "", "")
		if err := applyConfig(fs, write(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
	if err := applyConfig(flag.NewFlagSet("t", flag.ContinueOnError), write("")); err != nil {
		t.Errorf("an empty file: %v", err)
	}
}

func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	check := func(body string) (int, string) {
		p := filepath.Join(dir, "c.yaml")
		os.WriteFile(p, []byte(body), 0o644)
		var out, errOut strings.Builder
		code := configCheck([]string{"check", p}, &out, &errOut)
		return code, out.String() + errOut.String()
	}
	good := "data-dir: " + filepath.Join(dir, "data") + "\nlisten: 0.0.0.0:7443\ntls-self-signed: true\nnetwork: none\npool: minimal:small=2\nmetrics-interval: 30s\nmemory-overcommit: 2.5\n"
	if code, out := check(good); code != 0 || !strings.Contains(out, ": ok") {
		t.Fatalf("a good file: %d %s", code, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); err == nil {
		t.Error("config check made the data directory")
	}
	for body, want := range map[string]string{
		"listen: 0.0.0.0:7443\n":                        "plain HTTP only on loopback or unix:PATH; for other addresses give --tls-cert and --tls-key, or --tls-self-signed (see https://github.com/harebox/harebox/blob/main/docs/deploy.md#tls)",
		"network: bridge\n":                             `--network "bridge"`,
		"metrics-interval: 100ms\n":                     "--metrics-interval 100ms: at least 1s",
		"max-file-bytes: 1000\n":                        "--max-file-bytes 1000: at least 1 MiB",
		"memory-overcommit: 0\n":                        "--memory-overcommit 0: want a factor above 0, at most 64",
		"cpu-overcommit: 100\n":                         "--cpu-overcommit 100: want a factor above 0, at most 64",
		"tls-cert: /nonexistent.pem\ntls-key: /k.pem\n": "--tls-cert/--tls-key",
		"tls-cert: /c.pem\n":                            "go together",
		"address-pool: 10.0.0.0/33\n":                   "--address-pool",
		"hypervisor: xen\n":                             `--hypervisor "xen"`,
	} {
		if code, out := check(body); code != 1 || !strings.Contains(out, want) {
			t.Errorf("%q: exit %d %q, want %q", body, code, out, want)
		}
	}
	var out strings.Builder
	if code := configCheck([]string{"check"}, &out, &out); code != 2 || !strings.Contains(out.String(), "usage") {
		t.Errorf("no file: %d %s", code, out.String())
	}
}

func TestIngressFlags(t *testing.T) {
	for _, c := range []struct{ addr, base, cert, key, want string }{
		{"", "", "", "", ""},
		{"127.0.0.1:8443", "", "", "", "https://localhost:8443"},
		{"0.0.0.0:443", "https://apps.example.com", "c.pem", "k.pem", "https://apps.example.com"},
		{"0.0.0.0:443", "https://apps.example.com/", "", "", "https://apps.example.com"},
		{"0.0.0.0:443", "https://Apps.Example.com:8443", "", "", "https://apps.example.com:8443"},
	} {
		u, err := checkIngress(c.addr, c.base, c.cert, c.key)
		if err != nil || (u == nil) != (c.want == "") || (u != nil && u.String() != c.want) {
			t.Errorf("%+v: %v %v", c, u, err)
		}
	}
	for _, c := range [][4]string{
		{"", "https://x", "", ""},          // no listener
		{"8443", "", "", ""},               // not host:port
		{":8443", "http://x", "", ""},      // not https
		{":8443", "https://x/app", "", ""}, // a path
		{":8443", "", "c.pem", ""},         // a cert without its key
		{":8443", "https://x#f", "", ""},   // a fragment
	} {
		if u, err := checkIngress(c[0], c[1], c[2], c[3]); err == nil {
			t.Errorf("%q accepted: %v", c, u)
		}
	}
}

// TestGoldenByDefault: the server restores creates from golden snapshots
// unless told not to, on the command line or in its config file.
func TestGoldenByDefault(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "c.yaml")
	os.WriteFile(conf, []byte("golden-snapshots: false\n"), 0o644)
	for want, args := range map[bool][][]string{
		true:  {{}, {"--golden-snapshots"}, {"--golden-snapshots=false", "--golden-snapshots"}},
		false: {{"--golden-snapshots=false"}, {"--config", conf}},
	} {
		for _, a := range args {
			var got settings
			err := run(append([]string{"--data-dir", filepath.Join(dir, "data"), "--network", "none"}, a...), func(s settings) error { got = s; return nil })
			if err != nil || got.golden != want {
				t.Errorf("%q: golden %v %v, want %v", a, got.golden, err, want)
			}
		}
	}
}

// TestPoolByDefault: without --pool the server keeps the pool the host's
// capacity affords (clone.AutoPool), none with --pool none, an empty
// --pool or golden snapshots off, and what --pool or the config file says
// otherwise.
func TestPoolByDefault(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "c.yaml")
	os.WriteFile(conf, []byte("pool: none\n"), 0o644)
	data := filepath.Join(dir, "data") // (made at start: its filesystem counts)
	auto := clone.AutoPool(harebox.Capacity{}.Limits(dir))
	if auto == nil {
		t.Logf("this host admits fewer than 4 small sandboxes: auto keeps none")
	}
	for _, c := range []struct {
		args []string
		want map[string]int
	}{
		{nil, auto},
		{[]string{"--pool", "auto"}, auto},
		{[]string{"--pool", "none"}, nil},
		{[]string{"--pool", ""}, nil},
		{[]string{"--golden-snapshots=false"}, nil},
		{[]string{"--pool", "minimal:small=2"}, map[string]int{"minimal:small": 2}},
		{[]string{"--config", conf}, nil},
	} {
		var got settings
		err := run(append([]string{"--data-dir", data, "--network", "none"}, c.args...), func(s settings) error { got = s; return nil })
		if err != nil || !maps.Equal(got.pool, c.want) {
			t.Errorf("%q: pool %v %v, want %v", c.args, got.pool, err, c.want)
		}
	}
}

// The internal endpoint's flags: refused with a reason unless whole; a
// host certificate made by cluster-cert loads.
func TestClusterFlags(t *testing.T) {
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	if code := clusterCert([]string{"--dir", dir, "--host", "a", "--addr", "127.0.0.1"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "made the deployment CA") {
		t.Fatalf("cluster-cert: %d %s %s", code, out.String(), errOut.String())
	}
	if code := clusterCert([]string{"--dir", dir, "--host", "B/../x", "--addr", "127.0.0.1"}, &out, &errOut); code != 1 {
		t.Fatalf("cluster-cert with a bad name: %d", code)
	}
	ca, cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "a.pem"), filepath.Join(dir, "a.key")
	const pg = "postgres://x@db/h"
	for _, c := range []struct {
		addr, url, ca, cert, key, store, want string
	}{
		{"", "https://x:1", "", "", "", pg, "give --internal-listen"},
		{"127.0.0.1:7443", "", ca, cert, key, "", "PostgreSQL --store"},
		{"127.0.0.1:7443", "", "", cert, key, pg, "--cluster-ca"},
		{"7443", "", ca, cert, key, pg, "host:port"},
		{"127.0.0.1:7443", "http://x:1", ca, cert, key, pg, "--internal-url"},
		{"127.0.0.1:7443", "", ca, key, cert, pg, "cluster"},
	} {
		if _, _, err := checkCluster(c.addr, c.url, c.ca, c.cert, c.key, c.store); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c, err, c.want)
		}
	}
	tc, adv, err := checkCluster("127.0.0.1:7443", "", ca, cert, key, pg)
	if err != nil || tc == nil || adv != "https://127.0.0.1:7443" {
		t.Fatalf("whole flags: %v %q %v", tc, adv, err)
	}
	if tc, adv, err := checkCluster("", "", "", "", "", pg); tc != nil || adv != "" || err != nil {
		t.Fatalf("no internal endpoint: %v %q %v", tc, adv, err)
	}
}

// --audit-anchor: a file in the data directory by default, an absolute
// file or none if given; anything else refused before the server starts.
func TestAuditAnchorFlag(t *testing.T) {
	for v, want := range map[string]string{
		"":                      "file:/var/lib/harebox/audit.anchor",
		"none":                  "none",
		"file:/var/log/a.jsonl": "file:/var/log/a.jsonl",
	} {
		if got, err := checkAuditAnchor(v, "/var/lib/harebox"); err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", v, got, err, want)
		}
	}
	for _, v := range []string{"file:relative", "file:", "file:/var/log/", "journal", "/var/log/a"} {
		if got, err := checkAuditAnchor(v, "/x"); err == nil {
			t.Errorf("%q accepted: %q", v, got)
		}
	}
	dir := t.TempDir()
	if err := run([]string{"--data-dir", dir, "--network", "none", "--audit-anchor", "file:x"}, func(settings) error { return nil }); err == nil ||
		!strings.Contains(err.Error(), "--audit-anchor") {
		t.Errorf("a relative anchor: %v", err)
	}
	if err := run([]string{"--data-dir", dir, "--network", "none", "--audit-checkpoint-interval", "10ms"}, func(settings) error { return nil }); err == nil {
		t.Error("a 10ms checkpoint interval accepted")
	}
}

// TestE2BFlags: the E2B listener's flags, checked before anything starts.
func TestE2BFlags(t *testing.T) {
	for _, c := range []struct {
		addr, domain, cert, key string
		self                    bool
		templates               string
		tls                     bool
		want                    map[string]string
	}{
		{addr: "127.0.0.1:3000"},
		{addr: "localhost:3000", domain: "E2B.Example.com", templates: "base=default, py=python"},
		{addr: "0.0.0.0:443", domain: "e2b.example.com", cert: "c.pem", key: "k.pem", tls: true},
		{addr: "0.0.0.0:443", domain: "e2b.example.com", self: true, tls: true},
	} {
		s, err := checkE2B(c.addr, c.domain, c.cert, c.key, c.self, c.templates)
		if err != nil || s == nil || s.tlsOn != c.tls || s.domain != strings.ToLower(c.domain) {
			t.Errorf("%+v: %+v %v", c, s, err)
		}
		if c.templates != "" && (s == nil || s.templates["py"] != "python" || s.templates["base"] != "default") {
			t.Errorf("%+v: templates %v", c, s)
		}
	}
	if s, err := checkE2B("", "", "", "", false, ""); s != nil || err != nil {
		t.Errorf("no listener: %+v %v", s, err)
	}
	for _, c := range []struct {
		addr, domain, cert, key string
		self                    bool
		templates               string
	}{
		{addr: "", domain: "e2b.example.com"},        // no listener
		{addr: "3000"},                               // not host:port
		{addr: "0.0.0.0:3000"},                       // plain HTTP off loopback
		{addr: "10.0.0.1:3000", domain: "e.example"}, // the same
		{addr: ":443", cert: "c.pem"},                // a cert without its key
		{addr: ":443", cert: "c.pem", key: "k.pem", self: true, domain: "e.example"},
		{addr: ":443", self: true},                      // self-signed for no domain
		{addr: "127.0.0.1:3000", domain: "localhost"},   // one label
		{addr: "127.0.0.1:3000", domain: "a..example"},  // an empty label
		{addr: "127.0.0.1:3000", domain: "-a.example"},  // a label's edge
		{addr: "127.0.0.1:3000", templates: "base"},     // no image
		{addr: "127.0.0.1:3000", templates: "=default"}, // no name
	} {
		if s, err := checkE2B(c.addr, c.domain, c.cert, c.key, c.self, c.templates); err == nil {
			t.Errorf("%+v accepted: %+v", c, s)
		}
	}
}
