package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// The deployment's certificate authority signs every host's certificate;
// a host's internal endpoint takes only clients with one (mutual TLS), and
// a host forwarding a request checks the peer's the same way.

// hostNameRE is what a host's name may be (it names files too).
var hostNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,62}$`)

// ValidHostName reports whether name can name a host.
func ValidHostName(name string) bool { return hostNameRE.MatchString(name) }

// MakeCA makes the deployment's CA in dir (ca.pem, ca.key mode 0600) if it
// is not there; made says whether it was made now.
func MakeCA(dir string) (made bool, err error) {
	if _, err := os.Stat(filepath.Join(dir, "ca.pem")); err == nil {
		return false, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return false, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "HareBox deployment CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return false, err
	}
	if err := writeKeyPair(dir, "ca", der, key); err != nil {
		return false, err
	}
	return true, nil
}

// IssueHost signs a certificate for host name, valid for the addresses
// (IPs or DNS names) other hosts reach it at, as both server and client,
// for two years: dir/NAME.pem and dir/NAME.key.
func IssueHost(dir, name string, addrs []string) error {
	if !ValidHostName(name) {
		return fmt.Errorf("cluster: host name %q: lower-case letters, digits, dots and dashes", name)
	}
	if len(addrs) == 0 {
		return errors.New("cluster: a host certificate needs the addresses it is reached at")
	}
	ca, caKey, err := loadCA(dir)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name, OrganizationalUnit: []string{"harebox host"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(2, 0, 0),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, a)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	return writeKeyPair(dir, name, der, key)
}

func loadCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: the deployment CA: %w", err)
	}
	ca, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, err
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, errors.New("cluster: the deployment CA's key is not ECDSA")
	}
	return ca, key, nil
}

func writeKeyPair(dir, name string, der []byte, key *ecdsa.PrivateKey) error {
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	keyFile := filepath.Join(dir, name+".key")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// TLS is a host's side of the deployment's mutual TLS.
type TLS struct {
	// Server is the internal endpoint's: it asks every client for a
	// certificate of the deployment's CA.
	Server *tls.Config
	// Client is what a host forwards with: its certificate, and only the
	// deployment's CA trusted.
	Client *tls.Config
}

// LoadTLS reads the deployment's CA certificate and a host's certificate
// and key (PEM files).
func LoadTLS(caFile, certFile, keyFile string) (*TLS, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("cluster: %s holds no PEM certificate", caFile)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("cluster: %s is not a host certificate of the CA in %s: %w", certFile, caFile, err)
	}
	return &TLS{
		Server: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool},
		Client: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair}, RootCAs: pool},
	}, nil
}
