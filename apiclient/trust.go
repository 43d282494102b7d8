package apiclient

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// TLSConfig is the trust HAREBOX_CA names for an https server:
//   - a path to a PEM file of CA certificates: the roots this client
//     trusts, instead of the system's; the host name is verified;
//   - "sha256:" and the server certificate's SHA-256 fingerprint (64 hex
//     digits, any case, ":" between bytes allowed): the server must
//     present exactly that certificate, and chain and name are not
//     checked (the pin is the trust).
//
// Empty ca is the system's trust store.
func TLSConfig(ca string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca == "" {
		return cfg, nil
	}
	if hexPin, ok := strings.CutPrefix(ca, "sha256:"); ok {
		pin, err := hex.DecodeString(strings.ToLower(strings.ReplaceAll(hexPin, ":", "")))
		if err != nil || len(pin) != sha256.Size {
			return nil, fmt.Errorf("HAREBOX_CA %q: a fingerprint is sha256: and 64 hex digits", ca)
		}
		cfg.InsecureSkipVerify = true // (replaced by the pin, checked below)
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the server presented no certificate")
			}
			if got := sha256.Sum256(cs.PeerCertificates[0].Raw); string(got[:]) != string(pin) {
				return fmt.Errorf("the server's certificate (sha256:%x) is not the one HAREBOX_CA pins", got)
			}
			return nil
		}
		return cfg, nil
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, fmt.Errorf("HAREBOX_CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("HAREBOX_CA %s: no PEM certificate in it", ca)
	}
	cfg.RootCAs = roots
	return cfg, nil
}
