package linuxnet

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/firewall/credproxy"
)

// BenchmarkEgressProxy compares HTTPS through the egress proxy (example.com,
// a hostname rule) with HTTPS straight through nftables (pypi.org's
// address, a CIDR rule listed first), from the same guest to identical
// servers in the same run. Metrics:
//
//	throughput-ratio  proxied MB/s / direct MB/s for a 100 MiB download
//	latency-ratio     proxied / direct time for connect + TLS + small GET
//	added-ms          the difference in that time, in milliseconds
func BenchmarkEgressProxy(b *testing.B) {
	e := newEnv(b)
	n := e.newNetwork("")
	b.Cleanup(func() { n.Destroy(context.Background()) })
	g := e.attach(n, mustPolicy(b, `{"default_outbound":"deny","outbound":[
	  {"action":"allow","protocol":"tcp","ports":"443","cidrs":["`+pypiIP+`"]},
	  {"action":"allow","hosts":["example.com"],"ports":"443"}]}`))
	direct := target{addr: pypiIP + ":443", name: "pypi.org"}
	proxied := target{addr: exampleIP + ":443", name: "example.com"}

	// Warm up (DNS cache in the proxy, TLS code paths).
	for _, t := range []target{direct, proxied} {
		if _, err := g.fetch(t, "/"); err != nil {
			b.Fatal(err)
		}
	}
	var dBig, pBig, dSmall, pSmall time.Duration
	b.ResetTimer()
	for range b.N {
		for _, x := range []struct {
			t   target
			big *time.Duration
			sm  *time.Duration
		}{{direct, &dBig, &dSmall}, {proxied, &pBig, &pSmall}} {
			d, err := g.fetch(x.t, "/big")
			if err != nil {
				b.Fatal(err)
			}
			*x.big += d
			const small = 5
			for range small {
				d, err := g.fetch(x.t, "/")
				if err != nil {
					b.Fatal(err)
				}
				*x.sm += d / small
			}
		}
	}
	b.StopTimer()
	mbps := func(d time.Duration) float64 { return float64(bigSize*b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(dBig), "direct-MB/s")
	b.ReportMetric(mbps(pBig), "proxied-MB/s")
	b.ReportMetric(mbps(pBig)/mbps(dBig), "throughput-ratio")
	b.ReportMetric(float64(pSmall)/float64(dSmall), "latency-ratio")
	b.ReportMetric(float64(dSmall)/float64(b.N)/1e6, "direct-ms")
	b.ReportMetric(float64(pSmall-dSmall)/float64(b.N)/1e6, "added-ms")
}

type target struct{ addr, name string }

// fetch times connect + TLS handshake + GET path + reading the body.
func (g *guest) fetch(t target, path string) (time.Duration, error) {
	return g.fetchAuth(t, path, "")
}

// BenchmarkCredentialProxy compares, in one run and from one guest, HTTPS
// straight through nftables (pypi.org, a CIDR rule), through the egress
// proxy's passthrough (example.com, a hostname rule) and through the
// credential path (files.pythonhosted.org, a credential rule: TLS ended
// with the sandbox's CA, the placeholder swapped, TLS to the host).
// Beside them, a real proxy doing the same job: nginx (Debian's) at an
// address of its own on the test internet, reached straight through
// nftables (a CIDR rule, as pypi.org), ending the guest's TLS with its own
// certificate and re-originating it to files.pythonhosted.org with the
// real key set in Authorization (what the credential path does, less the
// placeholder check). Metrics: the p50 of connect + TLS + a small GET
// with the placeholder in Authorization (ms, and the credential path's
// added ms over direct and over nginx), and the throughput of a 100 MiB
// download as a ratio to direct and to nginx.
func BenchmarkCredentialProxy(b *testing.B) {
	e := newEnv(b)
	n := e.newNetwork("")
	b.Cleanup(func() { n.Destroy(context.Background()) })
	g := e.attach(n, mustPolicy(b, `{"default_outbound":"deny","outbound":[
	  {"action":"allow","protocol":"tcp","ports":"443","cidrs":["`+pypiIP+`","`+nginxIP+`"]},
	  {"action":"allow","hosts":["example.com","files.pythonhosted.org"],"ports":"443"}]}`))
	startNginx(b, e, "bench-secret-value")
	ca, key, err := credproxy.NewCA("bench CA")
	if err != nil {
		b.Fatal(err)
	}
	const ph = "hbph_benchplaceholder0123456789abcdef"
	sb := &credproxy.Sandbox{CA: ca, CAKey: key, Rules: []credproxy.Rule{{
		Hosts: []string{"files.pythonhosted.org"}, Header: "Authorization", Format: "Bearer {value}", Placeholder: ph, Value: "bench-secret-value",
	}}}
	n.SetCredentials(func(string) *credproxy.Sandbox { return sb })
	e.certs.AddCert(ca)
	targets := []target{
		{addr: pypiIP + ":443", name: "pypi.org"},
		{addr: exampleIP + ":443", name: "example.com"},
		{addr: filesIP + ":443", name: "files.pythonhosted.org"},
		{addr: nginxIP + ":443", name: "files.pythonhosted.org"},
	}
	for _, t := range targets {
		if _, err := g.fetchAuth(t, "/", ph); err != nil {
			b.Fatal(err)
		}
	}
	small := make([][]time.Duration, len(targets))
	big := make([]time.Duration, len(targets))
	b.ResetTimer()
	for range b.N {
		for i, t := range targets {
			d, err := g.fetchAuth(t, "/big", ph)
			if err != nil {
				b.Fatal(err)
			}
			big[i] += d
			for range 9 {
				d, err := g.fetchAuth(t, "/", ph)
				if err != nil {
					b.Fatal(err)
				}
				small[i] = append(small[i], d)
			}
		}
	}
	b.StopTimer()
	if got := e.saw("files.pythonhosted.org"); got != "auth=Bearer bench-secret-value query=" {
		b.Fatalf("the credential path did not swap: %q", got)
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2]) / 1e6
	}
	b.ReportMetric(p50(small[0]), "direct-p50-ms")
	b.ReportMetric(p50(small[1]), "passthrough-p50-ms")
	b.ReportMetric(p50(small[2]), "inject-p50-ms")
	b.ReportMetric(p50(small[2])-p50(small[0]), "inject-added-ms")
	b.ReportMetric(float64(bigSize*b.N)/big[0].Seconds()/1e6, "direct-MB/s")
	b.ReportMetric(float64(bigSize*b.N)/big[2].Seconds()/1e6, "inject-MB/s")
	b.ReportMetric(float64(big[0])/float64(big[2]), "inject-throughput-ratio")
	b.ReportMetric(float64(big[0])/float64(big[1]), "passthrough-throughput-ratio")
	b.ReportMetric(p50(small[3]), "nginx-p50-ms")
	b.ReportMetric(p50(small[2])-p50(small[3]), "inject-over-nginx-ms")
	b.ReportMetric(float64(bigSize*b.N)/big[3].Seconds()/1e6, "nginx-MB/s")
	b.ReportMetric(float64(big[3])/float64(big[2]), "inject/nginx-throughput")
}

// nginxIP is where startNginx serves, on the test internet.
const nginxIP = "198.18.0.13"

// startNginx runs nginx on the env's test internet at nginxIP:443 as a
// TLS-ending proxy to files.pythonhosted.org that sets Authorization to
// "Bearer "+secret: a certificate of its own (the guest trusts the env's),
// the upstream's verified, TLS 1.2 or 1.3 both ways, two workers (one a
// core), responses buffered in memory (4 x 64 KiB, never a temporary
// file): the fastest of the settings tried here (unbuffered with 4 KiB
// or 64 KiB, 8 x 256 KiB buffered gave 220 to 370 MB/s, this one 436).
func startNginx(b *testing.B, e *env, secret string) {
	b.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		b.Fatal("nginx is not installed (make deps installs Debian's nginx-light)")
	}
	dir := b.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			b.Fatal(err)
		}
		return p
	}
	cert := e.cert("files.pythonhosted.org")
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		b.Fatal(err)
	}
	e.mu.Lock()
	upstream := write("upstream.pem", slices.Clone(e.pems))
	e.mu.Unlock()
	conf := write("nginx.conf", fmt.Appendf(nil, `worker_processes 2;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  server {
    listen %[2]s:443 ssl;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate %[3]s;
    ssl_certificate_key %[4]s;
    location / {
      proxy_pass https://%[5]s:443;
      proxy_http_version 1.1;
      proxy_buffering on;
      proxy_max_temp_file_size 0;
      proxy_buffer_size 64k;
      proxy_buffers 4 64k;
      proxy_busy_buffers_size 128k;
      proxy_ssl_protocols TLSv1.2 TLSv1.3;
      proxy_ssl_server_name on;
      proxy_ssl_name files.pythonhosted.org;
      proxy_ssl_verify on;
      proxy_ssl_trusted_certificate %[6]s;
      proxy_set_header Host files.pythonhosted.org;
      proxy_set_header Authorization "Bearer %[7]s";
      proxy_set_header Connection "";
    }
  }
}
`, dir, nginxIP, write("cert.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})),
		write("key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})), filesIP, upstream, secret))
	sh(b, "ip", "-n", e.inet, "addr", "add", nginxIP+"/24", "dev", "eth0")
	cmd := exec.Command("ip", "netns", "exec", e.inet, bin, "-p", dir, "-c", conf, "-g", "daemon off;")
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGQUIT) // (its workers leave with the master)
		cmd.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var c net.Conn
		inNS(b, e.inet, func() { c, err = net.DialTimeout("tcp4", nginxIP+":443", time.Second) })
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			b.Fatalf("nginx did not listen on %s:443: %v\n%s%s", nginxIP, err, out, log)
		}
	}
}

// fetchAuth is fetch with a placeholder (if not "") in Authorization.
func (g *guest) fetchAuth(t target, path, ph string) (time.Duration, error) {
	start := time.Now()
	c, err := g.dial("tcp4", t.addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: t.name, RootCAs: g.e.certs, NextProtos: []string{"http/1.1"}})
	auth := ""
	if ph != "" {
		auth = "Authorization: Bearer " + ph + "\r\n"
	}
	fmt.Fprintf(tc, "GET %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n", path, t.name, auth)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return 0, err
	}
	nb, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, err
	}
	if path == "/big" && nb != bigSize || path == "/" && nb == 0 {
		return 0, fmt.Errorf("%s%s: %d bytes", t.name, path, nb)
	}
	return time.Since(start), nil
}
