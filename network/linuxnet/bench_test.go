package linuxnet

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"slices"
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
// Metrics: the p50 of connect + TLS + a small GET with the placeholder in
// Authorization (ms, and the credential path's added ms over direct), and
// the throughput of a 100 MiB download as a ratio to direct.
func BenchmarkCredentialProxy(b *testing.B) {
	e := newEnv(b)
	n := e.newNetwork("")
	b.Cleanup(func() { n.Destroy(context.Background()) })
	g := e.attach(n, mustPolicy(b, `{"default_outbound":"deny","outbound":[
	  {"action":"allow","protocol":"tcp","ports":"443","cidrs":["`+pypiIP+`"]},
	  {"action":"allow","hosts":["example.com","files.pythonhosted.org"],"ports":"443"}]}`))
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
