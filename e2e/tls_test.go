package e2e

import (
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/servertls"
)

// TestTLS: hareboxd serves HTTPS with a self-signed certificate it makes
// on first start and keeps; the CLI trusts it by CA file or by pinned
// fingerprint (HAREBOX_CA) and by nothing else; only TLS 1.3, with
// HTTP/2. A server on certificate files reloads them on SIGHUP while a
// request loop runs, and no request fails.
func TestTLS(t *testing.T) {
	s := testserver.PrepareNoVM(t)
	dataDir, err := os.MkdirTemp("", "hbtls")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	noVM := []string{"--image-dir", filepath.Join(dataDir, "no-images"), "--plugin", s.Plugin, "--network", "none"}
	srv := testserver.Launch(t, s, dataDir, append(noVM, "--tls-self-signed")...)
	if !strings.HasPrefix(srv.URL, "https://") {
		t.Fatalf("server URL %s", srv.URL)
	}
	fp, err := os.ReadFile(filepath.Join(dataDir, "tls", "fingerprint"))
	if err != nil {
		t.Fatal(err)
	}
	pin := strings.TrimSpace(string(fp))
	if !strings.Contains(srv.Log.String(), pin) {
		t.Errorf("the log does not give the fingerprint %s", pin)
	}
	cli := func(ca string) (string, string, int) {
		t.Helper()
		return testserver.RunCLI(t, s, srv, "", "--ca", ca, "list")
	}
	for _, ca := range []string{srv.CA, pin, strings.ToUpper(strings.TrimPrefix(pin, "sha256:"))} {
		if !strings.HasPrefix(ca, "sha256:") && !strings.HasPrefix(ca, "/") {
			ca = "sha256:" + ca
		}
		if out, errOut, code := cli(ca); code != 0 {
			t.Errorf("trusting %s: exit %d: %s %s", ca, code, out, errOut)
		}
	}
	// Not trusted: the system's roots, a wrong pin. No fallback to plain
	// or unverified.
	if _, errOut, code := testserver.RunCLI(t, s, srv, "", "--ca", "sha256:"+strings.Repeat("ab", 32), "list"); code == 0 || !strings.Contains(errOut, "pins") {
		t.Errorf("a wrong pin: exit %d: %s", code, errOut)
	}
	t.Setenv("HAREBOX_CA", "")
	c, err := apiclient.Open(apiclient.Options{URL: srv.URL, Key: srv.Key, CA: "-"})
	if err == nil {
		t.Errorf("a CA file that does not exist was accepted: %v", c)
	}
	c, _ = apiclient.Open(apiclient.Options{URL: srv.URL, Key: srv.Key, CA: ""})
	if err := c.Do(t.Context(), "GET", "/v1/sandboxes", nil, nil, nil); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("trusting the system's roots: %v", err)
	}
	// TLS 1.3 with HTTP/2; TLS 1.2 is refused; plain HTTP is not served.
	resp, err := srv.HTTP.Get(srv.URL + "/health")
	if err != nil || resp.ProtoMajor != 2 || resp.TLS.Version != tls.VersionTLS13 {
		t.Errorf("health: %v %+v", err, resp)
	} else {
		resp.Body.Close()
	}
	old, _ := apiclient.TLSConfig(srv.CA)
	old.MaxVersion = tls.VersionTLS12
	if _, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: old}}).Get(srv.URL + "/health"); err == nil {
		t.Error("a TLS 1.2 client was served")
	}
	if resp, err := http.Get("http://" + strings.TrimPrefix(srv.URL, "https://") + "/health"); err == nil {
		// (Go's TLS server answers a plain request with this 400.)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(body), "HTTP request to an HTTPS server") {
			t.Errorf("plain HTTP on the TLS port: %d %s", resp.StatusCode, body)
		}
	}
	// A restart keeps the certificate: a pin stays good.
	srv.Stop(t)
	srv = testserver.Launch(t, s, dataDir, append(noVM, "--tls-self-signed")...)
	if _, errOut, code := testserver.RunCLI(t, s, srv, "", "--ca", pin, "list"); code != 0 {
		t.Errorf("the pin after a restart: %s", errOut)
	}
	srv.Stop(t)

	// Certificate files, replaced and reloaded on SIGHUP under load.
	certs := t.TempDir()
	a, _, _, err := servertls.SelfSigned(filepath.Join(certs, "a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _, _, err := servertls.SelfSigned(filepath.Join(certs, "b"), nil)
	if err != nil {
		t.Fatal(err)
	}
	both := filepath.Join(certs, "both.pem")
	os.WriteFile(both, append(testserver.ReadFile(t, a), testserver.ReadFile(t, b)...), 0o644)
	certFile, keyFile := filepath.Join(certs, "cert.pem"), filepath.Join(certs, "key.pem")
	testserver.CopyFile(t, a, certFile)
	testserver.CopyFile(t, strings.Replace(a, "cert.pem", "key.pem", 1), keyFile)
	dataDir2, err := os.MkdirTemp("", "hbtls")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir2)
	srv = testserver.Launch(t, s, dataDir2, "--image-dir", filepath.Join(dataDir2, "no-images"), "--plugin", s.Plugin, "--network", "none",
		"--tls-cert", certFile, "--tls-key", keyFile)
	defer srv.Stop(t)
	cfg, err := apiclient.TLSConfig(both)
	if err != nil {
		t.Fatal(err)
	}
	served := func() string {
		conn, err := tls.Dial("tcp", strings.TrimPrefix(srv.URL, "https://"), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return servertls.Fingerprint(conn.ConnectionState().PeerCertificates[0].Raw)
	}
	fpA, fpB := strings.TrimSpace(string(testserver.ReadFile(t, filepath.Join(certs, "a", "fingerprint")))), strings.TrimSpace(string(testserver.ReadFile(t, filepath.Join(certs, "b", "fingerprint"))))
	if got := served(); got != fpA {
		t.Fatalf("serving %s, want %s", got, fpA)
	}
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, keepAlive := range []bool{true, false} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg.Clone(), DisableKeepAlives: !keepAlive, ForceAttemptHTTP2: true}}
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest("GET", srv.URL+"/v1/sandboxes", nil)
				req.Header.Set("Authorization", "Bearer "+srv.Key)
				resp, err := hc.Do(req)
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode != 200 {
						err = &apiclient.Error{Status: resp.StatusCode, Message: resp.Status}
					}
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				} else {
					ok.Add(1)
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	// The new pair, with the old files' times: only the signal tells.
	ci, _ := os.Stat(certFile)
	ki, _ := os.Stat(keyFile)
	testserver.CopyFile(t, b, certFile)
	testserver.CopyFile(t, strings.Replace(b, "cert.pem", "key.pem", 1), keyFile)
	os.Chtimes(certFile, ci.ModTime(), ci.ModTime())
	os.Chtimes(keyFile, ki.ModTime(), ki.ModTime())
	srv.Cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(5 * time.Second)
	for served() != fpB {
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP: still serving the old certificate after 5 s\n%s", testserver.Tail(srv.Log.String()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || ok.Load() < 10 {
		t.Fatalf("%d requests failed across the reload (first: %v), %d succeeded", failed.Load(), firstErr.Load(), ok.Load())
	}
	t.Logf("%d requests across the reload, none failed", ok.Load())
}
