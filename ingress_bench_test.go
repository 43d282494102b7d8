package harebox_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/ingress"
	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/network/linuxnet"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/servertls"
)

// BenchmarkIngressVM: a web app in a real VM (the minimal image), reached
// through the engine's ingress (HTTPS with HTTP/2, the token checked and
// taken off, proxied over the sandbox's tap) and straight at the guest's
// address over the same tap (plain HTTP/1.1), in one run, over kept-alive
// connections. Metrics: p50 latency of a small GET and throughput of an
// 8 MiB download, each as ingress/direct (goals: at most 1.2 and at
// least 0.85).
func BenchmarkIngressVM(b *testing.B) {
	v, done := benchEnv(b)
	defer done()
	if _, err := os.Stat("/usr/sbin/nft"); err != nil {
		b.Skip("needs nft")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n, err := linuxnet.New(ctx, linuxnet.Options{StateDir: filepath.Join(v.dataDir, "net"), Table: "harebox_bench",
		Pool: netip.MustParsePrefix("10.238.0.0/24"), Upstream: "127.0.0.1:53"})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Destroy(context.Background())
	il, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	opts := v.options()
	opts.Network = n
	opts.MaxFileBytes = 64 << 20 // the app's binary
	opts.Ingress, _ = url.Parse("https://localhost:" + fmt.Sprint(il.Addr().(*net.TCPAddr).Port))
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	cert, key, _, err := servertls.SelfSigned(filepath.Join(v.dataDir, "tls"), nil)
	if err != nil {
		b.Fatal(err)
	}
	src, err := servertls.Load(cert, key, nil)
	if err != nil {
		b.Fatal(err)
	}
	served := make(chan struct{})
	go func() { eng.URLs().Serve(ctx, il, servertls.Config(src)); close(served) }()
	defer func() { cancel(); <-served }()

	box, err := eng.Create(ctx, sandbox.CreateRequest{Image: "minimal"})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Delete(context.Background(), box.ID)
	web, err := os.Open(testimage.Package(b, "./e2e/testdata/guestweb", "guestweb"))
	if err != nil {
		b.Fatal(err)
	}
	defer web.Close()
	if _, err := eng.WriteFile(ctx, box.ID, "/tmp/guestweb", web, sandbox.WriteOptions{Mode: 0o755}); err != nil {
		b.Fatal(err)
	}
	if _, err := eng.Processes().Start(ctx, box.ID, sandbox.ExecRequest{Argv: []string{"/tmp/guestweb", "-listen", ":8080"}}); err != nil {
		b.Fatal(err)
	}
	u, err := eng.URLCalls().Create(ctx, box.ID, sandbox.URLRequest{Port: 8080})
	if err != nil {
		b.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(src.Leaf())
	through := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}}
	straight := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return n.DialGuest(ctx, box.ID, 8080)
	}}}
	get := func(c *http.Client, rawURL string, tok bool) (time.Duration, int64, error) {
		req, _ := http.NewRequest("GET", rawURL, nil)
		if tok {
			req.Header.Set(ingress.TokenHeader, u.Token)
		}
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			return 0, 0, err
		}
		nb, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("%s: %s", rawURL, resp.Status)
		}
		return time.Since(start), nb, err
	}
	direct := "http://guest/"
	// The app starts in the background.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if _, _, err := get(straight, direct, false); err == nil || time.Now().After(deadline) {
			break
		}
	}
	for _, w := range []func() (time.Duration, int64, error){
		func() (time.Duration, int64, error) { return get(straight, direct, false) },
		func() (time.Duration, int64, error) { return get(through, u.PathURL, true) },
	} {
		if _, _, err := w(); err != nil {
			b.Fatal(err)
		}
	}
	const small = 20
	var dLat, iLat []time.Duration
	var dBig, iBig time.Duration
	var dBytes, iBytes int64
	const bigPath = "big"
	b.ResetTimer()
	for range b.N {
		for range small {
			d, _, err := get(straight, direct, false)
			if err != nil {
				b.Fatal(err)
			}
			dLat = append(dLat, d)
			d, _, err = get(through, u.PathURL, true)
			if err != nil {
				b.Fatal(err)
			}
			iLat = append(iLat, d)
		}
		d, nb, err := get(straight, direct+bigPath, false)
		if err != nil {
			b.Fatal(err)
		}
		dBig, dBytes = dBig+d, dBytes+nb
		d, nb, err = get(through, u.PathURL+bigPath, true)
		if err != nil {
			b.Fatal(err)
		}
		iBig, iBytes = iBig+d, iBytes+nb
	}
	b.StopTimer()
	p50 := func(l []time.Duration) time.Duration { slices.Sort(l); return l[len(l)/2] }
	b.ReportMetric(float64(p50(dLat).Microseconds()), "direct-p50-us")
	b.ReportMetric(float64(p50(iLat).Microseconds()), "ingress-p50-us")
	b.ReportMetric(float64(p50(iLat))/float64(p50(dLat)), "latency-ratio")
	mbps := func(nb int64, d time.Duration) float64 { return float64(nb) / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(dBytes, dBig), "direct-MB/s")
	b.ReportMetric(mbps(iBytes, iBig), "ingress-MB/s")
	b.ReportMetric(mbps(iBytes, iBig)/mbps(dBytes, dBig), "throughput-ratio")
}
