package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestDoctor(t *testing.T) {
	var out bytes.Buffer
	code := doctor(&out)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "qemu: ") || !strings.HasPrefix(lines[1], "cloud-hypervisor: ") {
		t.Fatalf("doctor output:\n%s", out.String())
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
	if qemuErr == nil && code != 0 {
		t.Errorf("exit %d with a usable backend", code)
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
