package cluster

import (
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"testing"
)

// A host's TLS takes only certificates of its deployment's CA, both ways.
func TestMutualTLS(t *testing.T) {
	ours, theirs := t.TempDir(), t.TempDir()
	for _, dir := range []string{ours, theirs} {
		if made, err := MakeCA(dir); err != nil || !made {
			t.Fatal(made, err)
		}
		if err := IssueHost(dir, "a", []string{"127.0.0.1"}); err != nil {
			t.Fatal(err)
		}
	}
	if made, err := MakeCA(ours); err != nil || made {
		t.Fatalf("a second MakeCA: made %v, %v (it must keep the CA)", made, err)
	}
	if err := IssueHost(ours, "../a", []string{"127.0.0.1"}); err == nil {
		t.Fatal("a host name with a path was taken")
	}
	if err := IssueHost(ours, "b", nil); err == nil {
		t.Fatal("a certificate without addresses was issued")
	}
	if err := IssueHost(ours, "b", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	load := func(caDir, certDir, name string) (*TLS, error) {
		return LoadTLS(filepath.Join(caDir, "ca.pem"), filepath.Join(certDir, name+".pem"), filepath.Join(certDir, name+".key"))
	}
	if _, err := load(ours, theirs, "a"); err == nil {
		t.Fatal("a certificate of another CA was loaded")
	}
	server, err := load(ours, ours, "a")
	if err != nil {
		t.Fatal(err)
	}
	peer, _ := load(ours, ours, "b")
	stranger, _ := load(theirs, theirs, "a")

	l, err := tls.Listen("tcp", "127.0.0.1:0", server.Server)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if c.(*tls.Conn).Handshake() == nil {
					c.Write([]byte("ok"))
				}
			}()
		}
	}()
	dial := func(cfg *tls.Config) error {
		c, err := tls.Dial("tcp", l.Addr().String(), cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		b := make([]byte, 2)
		if _, err := c.Read(b); err != nil {
			return err // (TLS 1.3: a refused client certificate shows here)
		}
		if string(b) != "ok" {
			return errors.New(string(b))
		}
		return nil
	}
	if err := dial(peer.Client); err != nil {
		t.Fatalf("a host of the deployment: %v", err)
	}
	if err := dial(stranger.Client); err == nil {
		t.Fatal("a host of another deployment got through")
	}
	noCert := peer.Client.Clone()
	noCert.Certificates = nil
	if err := dial(noCert); err == nil {
		t.Fatal("a client without a certificate got through")
	}
	// A host of another deployment is not trusted as a server either.
	l2, err := tls.Listen("tcp", "127.0.0.1:0", stranger.Server)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	go func() {
		if c, err := l2.Accept(); err == nil {
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", l2.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, peer.Client)
	if err := tc.Handshake(); err == nil {
		t.Fatal("a server of another deployment was trusted")
	}
	tc.Close()
}
