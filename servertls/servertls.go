// Package servertls gives the API server its TLS certificate: one read from
// files and read again when they change (or when asked, on SIGHUP), or a
// self-signed one made on first start and kept in the data directory. New
// connections get the newest certificate; open ones keep theirs, so a
// reload drops nothing.
package servertls

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Config is the server's TLS settings: TLS 1.3 only (every supported
// client speaks it; its cipher suites are all AEADs with forward secrecy),
// HTTP/2 and HTTP/1.1, the certificate from src.
func Config(src *Source) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		NextProtos:     []string{"h2", "http/1.1"},
		GetCertificate: src.certificate,
	}
}

// Source holds the certificate the server presents.
type Source struct {
	certFile, keyFile string
	log               *slog.Logger

	// reload serialises Reload (the watcher's and SIGHUP's).
	reload sync.Mutex

	mu      sync.Mutex
	cert    *tls.Certificate
	certMod time.Time
	keyMod  time.Time
	// failed says the last reload failed: Watch tries again every round
	// (a file rewritten within one mtime tick would not change it again).
	failed bool
}

// Load reads a certificate chain and its key (PEM files). The first
// certificate of certFile is the server's.
func Load(certFile, keyFile string, log *slog.Logger) (*Source, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Source{certFile: certFile, keyFile: keyFile, log: log}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Reload reads the files again. On an error (a half-written file, a key
// that does not match) the certificate in use stays.
func (s *Source) Reload() error {
	s.reload.Lock()
	defer s.reload.Unlock()
	certMod, keyMod := modTime(s.certFile), modTime(s.keyFile)
	err := s.load()
	s.mu.Lock()
	s.certMod, s.keyMod, s.failed = certMod, keyMod, err != nil
	s.mu.Unlock()
	return err
}

func (s *Source) load() error {
	c, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
	if err != nil {
		return fmt.Errorf("TLS certificate %s, key %s: %w", s.certFile, s.keyFile, err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return fmt.Errorf("TLS certificate %s: %w", s.certFile, err)
	}
	c.Leaf = leaf
	s.mu.Lock()
	changed := s.cert == nil || !bytes.Equal(s.cert.Certificate[0], c.Certificate[0])
	s.cert = &c
	s.mu.Unlock()
	if changed {
		s.log.Info("TLS certificate loaded", "file", s.certFile, "fingerprint", Fingerprint(leaf.Raw), "expires", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// Watch reloads the files whenever either one's modification time
// changes, checking every interval, until ctx ends.
func (s *Source) Watch(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		same := modTime(s.certFile).Equal(s.certMod) && modTime(s.keyFile).Equal(s.keyMod)
		failed := s.failed
		s.mu.Unlock()
		if same && !failed {
			continue
		}
		if err := s.Reload(); err != nil && !failed {
			// (Said once; tried again every round until it loads.)
			s.log.Warn("TLS certificate not reloaded; the previous one stays", "err", err)
		}
	}
}

// Leaf is the certificate presented now.
func (s *Source) Leaf() *x509.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cert.Leaf
}

func (s *Source) certificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cert, nil
}

func modTime(path string) time.Time {
	fi, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// Fingerprint is a certificate's SHA-256 fingerprint as clients pin it
// (HAREBOX_CA): "sha256:" and 64 lowercase hex digits.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Self-signed certificate files in their directory.
const (
	CertFile        = "cert.pem"
	KeyFile         = "key.pem"
	FingerprintFile = "fingerprint"
)

// SelfSigned returns the certificate and key files in dir, making them on
// first use: an ECDSA P-256 key and a certificate valid for ten years for
// localhost, the loopback addresses, this host's name and hosts (names or
// addresses). The certificate is its own CA, so clients can trust it as
// HAREBOX_CA=dir/cert.pem, or pin the fingerprint kept in dir/fingerprint.
// Names added to hosts later do not change a certificate already made.
func SelfSigned(dir string, hosts []string) (certFile, keyFile string, created bool, err error) {
	certFile, keyFile = filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile)
	if _, err := os.Stat(certFile); err == nil {
		return certFile, keyFile, false, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", false, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", false, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return "", "", false, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"HareBox"}, CommonName: "hareboxd"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	if h, err := os.Hostname(); err == nil && h != "" && h != "localhost" {
		tmpl.DNSNames = append(tmpl.DNSNames, h)
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !ip.IsUnspecified() && !ip.IsLoopback() {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			}
		} else if h != "" && h != "localhost" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", false, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", false, err
	}
	// The key first, the certificate last: a certificate on disk means
	// both are there (a crash in between makes a new pair next start).
	if err := writeFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", false, err
	}
	if err := writeFile(filepath.Join(dir, FingerprintFile), []byte(Fingerprint(der)+"\n"), 0o644); err != nil {
		return "", "", false, err
	}
	if err := writeFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return "", "", false, err
	}
	return certFile, keyFile, true, nil
}

// writeFile writes through a temporary file and a rename, so a reader
// sees the whole file or none.
func writeFile(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return nil
}
