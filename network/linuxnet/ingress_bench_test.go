package linuxnet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/ingress"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/servertls"
	"github.com/harebox/harebox/store"
)

// BenchmarkIngress compares, in one run, a guest's web app reached through
// the ingress (HTTPS with HTTP/2 to the ingress, the token checked and
// taken off, proxied over the guest's link) with the same app reached
// straight at the guest's address (plain HTTP/1.1 over the same link),
// both over kept-alive connections. Metrics: the p50 latency of a small
// GET (µs, and the ratio), and the throughput of an 8 MiB download (MB/s,
// and the ratio). The guest is a network namespace: its app answers in
// microseconds, so what the ingress adds is all there is to see.
// ingressBigSize is the ingress benchmarks' download.
const ingressBigSize = 8 << 20

func BenchmarkIngress(b *testing.B) {
	e := newEnv(b)
	n := e.newNetwork("")
	g := e.attach(n, firewall.Default())
	var ln net.Listener
	var err error
	inNS(b, g.ns, func() { ln, err = net.Listen("tcp4", ":8080") })
	if err != nil {
		b.Fatal(err)
	}
	big := make([]byte, ingressBigSize)
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Write(big)
			return
		}
		io.WriteString(w, "ok")
	})}
	go app.Serve(ln)
	b.Cleanup(func() { app.Close() })

	ctx, cancel := context.WithCancel(context.Background())
	db, err := store.OpenSQLite(ctx, filepath.Join(b.TempDir(), "db"))
	if err != nil {
		b.Fatal(err)
	}
	il, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	base, _ := url.Parse("https://localhost:" + fmt.Sprint(il.Addr().(*net.TCPAddr).Port))
	svc, err := ingress.New(ctx, ingress.Options{Store: db, Guests: n, Base: base})
	if err != nil {
		b.Fatal(err)
	}
	cert, key, _, err := servertls.SelfSigned(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	src, err := servertls.Load(cert, key, nil)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { svc.Serve(ctx, il, servertls.Config(src)); close(done) }()
	b.Cleanup(func() { cancel(); <-done; db.Close() })
	u, err := svc.Create(ctx, ingress.Owner{SandboxID: g.id, AccountID: "acc"}, sandbox.URLRequest{Port: 8080})
	if err != nil {
		b.Fatal(err)
	}

	roots := x509.NewCertPool()
	roots.AddCert(src.Leaf())
	through := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}}
	// Straight to the guest's address: the ingress's own dial (the
	// firewall lets in nothing else), without the ingress.
	straight := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return n.DialGuest(ctx, g.id, 8080)
	}}}
	get := func(c *http.Client, rawURL string, tok bool) (time.Duration, error) {
		req, _ := http.NewRequest("GET", rawURL, nil)
		if tok {
			req.Header.Set(ingress.TokenHeader, u.Token)
		}
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("%s: %s", rawURL, resp.Status)
		}
		return time.Since(start), err
	}
	direct := "http://" + g.addr.String() + ":8080/"
	for _, w := range []func() (time.Duration, error){
		func() (time.Duration, error) { return get(straight, direct, false) },
		func() (time.Duration, error) { return get(through, u.PathURL, true) },
	} {
		if _, err := w(); err != nil { // warm: connections, TLS
			b.Fatal(err)
		}
	}
	const small = 50
	var dLat, iLat []time.Duration
	var dBig, iBig time.Duration
	b.ResetTimer()
	for range b.N {
		for range small {
			d, err := get(straight, direct, false)
			if err != nil {
				b.Fatal(err)
			}
			dLat = append(dLat, d)
			d, err = get(through, u.PathURL, true)
			if err != nil {
				b.Fatal(err)
			}
			iLat = append(iLat, d)
		}
		d, err := get(straight, direct+"big", false)
		if err != nil {
			b.Fatal(err)
		}
		dBig += d
		d, err = get(through, u.PathURL+"big", true)
		if err != nil {
			b.Fatal(err)
		}
		iBig += d
	}
	b.StopTimer()
	p50 := func(l []time.Duration) time.Duration { slices.Sort(l); return l[len(l)/2] }
	mbps := func(d time.Duration) float64 { return float64(ingressBigSize*b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(float64(p50(dLat).Microseconds()), "direct-p50-us")
	b.ReportMetric(float64(p50(iLat).Microseconds()), "ingress-p50-us")
	b.ReportMetric(float64(p50(iLat))/float64(p50(dLat)), "latency-ratio")
	b.ReportMetric(mbps(dBig), "direct-MB/s")
	b.ReportMetric(mbps(iBig), "ingress-MB/s")
	b.ReportMetric(mbps(iBig)/mbps(dBig), "throughput-ratio")
}
