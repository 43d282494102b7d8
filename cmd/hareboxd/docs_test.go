package main

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/harebox/harebox/internal/doccmds"
)

// TestDocsFlags: every hareboxd command line the README and docs/ show
// gives only flags hareboxd (or its subcommand) takes.
func TestDocsFlags(t *testing.T) {
	lines, err := doccmds.Find("../..", "hareboxd")
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) < 20 {
		t.Fatalf("found %d hareboxd command lines in the docs: the scan is broken", len(lines))
	}
	var serve, cert bytes.Buffer
	clusterCert([]string{"--help"}, &cert, &cert)
	// (run's flag set prints on the process's stderr.)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	done := make(chan struct{})
	go func() { io.Copy(&serve, r); close(done) }()
	run([]string{"--help"}, nil)
	os.Stderr = stderr
	w.Close()
	<-done
	for _, l := range lines {
		help := serve.String()
		switch f := doccmds.Fields(l.Args); {
		case len(f) > 0 && f[0] == "cluster-cert":
			help = cert.String()
		case len(f) > 0 && (f[0] == "doctor" || f[0] == "config"):
			continue // (their arguments, no flags)
		}
		for _, fl := range doccmds.Flags(l.Args) {
			if !doccmds.Takes(help, fl) {
				t.Errorf("%s: hareboxd %s: no flag --%s", l.File, l.Args, fl)
			}
		}
	}
	if !strings.Contains(serve.String(), "-data-dir") || !strings.Contains(cert.String(), "-addr") {
		t.Fatalf("the help texts read are not hareboxd's:\n%s\n%s", serve.String(), cert.String())
	}
}
