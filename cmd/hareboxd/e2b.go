package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/api"
	"github.com/harebox/harebox/e2b"
	"github.com/harebox/harebox/e2b/envd"
	"github.com/harebox/harebox/internal/docslink"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/servertls"
)

// e2bSettings are the E2B listener's flags, checked.
type e2bSettings struct {
	addr, domain      string
	certFile, keyFile string
	selfSigned        bool
	templates         map[string]string
	tlsOn             bool
}

// checkE2B checks the E2B listener's flags (nil: no listener).
func checkE2B(addr, domain, certFile, keyFile string, selfSigned bool, templates string) (*e2bSettings, error) {
	if addr == "" {
		if domain != "" || certFile != "" || keyFile != "" || selfSigned || templates != "" {
			return nil, errors.New("--e2b-domain, --e2b-tls-* and --e2b-templates: give --e2b-listen too")
		}
		return nil, nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--e2b-listen %q: want host:port", addr)
	}
	s := &e2bSettings{addr: addr, domain: strings.ToLower(domain), certFile: certFile, keyFile: keyFile, selfSigned: selfSigned}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--e2b-tls-cert and --e2b-tls-key go together")
	}
	if certFile != "" && selfSigned {
		return nil, errors.New("--e2b-tls-cert or --e2b-tls-self-signed, not both")
	}
	s.tlsOn = certFile != "" || selfSigned
	if ip := net.ParseIP(host); !s.tlsOn && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("--e2b-listen %q: plain HTTP only on loopback (envd's access tokens travel on it); for other addresses give --e2b-tls-cert and --e2b-tls-key, or --e2b-tls-self-signed%s", addr, docslink.See(docslink.E2B))
	}
	if selfSigned && domain == "" {
		return nil, errors.New("--e2b-tls-self-signed makes a certificate for *.DOMAIN: give --e2b-domain")
	}
	if domain != "" && !validDomain(s.domain) {
		return nil, fmt.Errorf("--e2b-domain %q: a DNS name, e.g. e2b.example.com", domain)
	}
	if templates != "" {
		s.templates = map[string]string{}
		for _, kv := range strings.Split(templates, ",") {
			name, image, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || name == "" || image == "" {
				return nil, fmt.Errorf("--e2b-templates %q: want TEMPLATE=IMAGE[,TEMPLATE=IMAGE...]", templates)
			}
			s.templates[name] = image
		}
	}
	return s, nil
}

// validDomain: dot-separated DNS labels, at least two.
func validDomain(d string) bool {
	labels := strings.Split(d, ".")
	if len(labels) < 2 || len(d) > 200 {
		return false
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// serveE2B starts the E2B listener: the control plane and each
// sandbox's envd on one address (e2b.Router). It returns the server, to
// be shut down with the others.
func serveE2B(ctx context.Context, s *e2bSettings, eng *harebox.Engine, sandboxNet network.Network, root *api.RootKey, dataDir string, log *slog.Logger, errc chan<- error) (*http.Server, error) {
	o := e2b.Options{Engine: eng, Secrets: eng.Secrets(), Root: root, Templates: s.templates, Domain: s.domain, Log: log}
	if g, ok := sandboxNet.(e2b.Guests); ok {
		o.Guests = g // (--network none: no port is served)
	}
	cp := e2b.New(o)
	ev := envd.New(envd.Options{Files: eng, Access: cp, Filesystem: eng, Processes: eng.Processes()})
	hs := &http.Server{
		Handler:           &e2b.Router{API: cp, Envd: ev.Handler, Interpreter: cp.Interpreter, Ports: cp.Port, Domain: s.domain},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	l, err := net.Listen("tcp", s.addr)
	if err != nil {
		return nil, fmt.Errorf("--e2b-listen: %w", err)
	}
	scheme := "http"
	if s.tlsOn {
		certFile, keyFile := s.certFile, s.keyFile
		if s.selfSigned {
			var created bool
			certFile, keyFile, created, err = servertls.SelfSigned(filepath.Join(dataDir, "e2b-tls"), []string{s.domain, "*." + s.domain})
			if err != nil {
				l.Close()
				return nil, fmt.Errorf("--e2b-tls-self-signed: %w", err)
			}
			if created {
				log.Info("made a self-signed certificate for the E2B listener", "file", certFile)
			}
		}
		src, err := servertls.Load(certFile, keyFile, log)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("e2b: %w", err)
		}
		go src.Watch(ctx, 2*time.Second)
		l = tls.NewListener(l, servertls.Config(src))
		scheme = "https"
	}
	go func() { errc <- hs.Serve(l) }()
	log.Info("E2B listener", "addr", s.addr, "scheme", scheme, "domain", s.domain,
		"templates", templateList(s.templates))
	return hs, nil
}

func templateList(m map[string]string) string {
	if m == nil {
		m = e2b.DefaultTemplates
	}
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}
