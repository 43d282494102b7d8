// The untrusted-code walkthrough on a Go client generated from
// api/openapi.yaml by oapi-codegen (e2e/clients'
// TestWalkthrough/GeneratedClient generates ./gen first; it is not kept
// in the repository). HAREBOX_URL, HAREBOX_API_KEY, and HAREBOX_CA (a
// PEM file) for an https server.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/harebox/harebox/e2e/testdata/genwalk/gen"
)

func main() {
	if err := walk(); err != nil {
		fmt.Fprintln(os.Stderr, "walkthrough:", err)
		os.Exit(1)
	}
}

func walk() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	hc := &http.Client{}
	if ca := os.Getenv("HAREBOX_CA"); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("%s: no certificate", ca)
		}
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	}
	key := os.Getenv("HAREBOX_API_KEY")
	c, err := gen.NewClientWithResponses(os.Getenv("HAREBOX_URL"), gen.WithHTTPClient(hc),
		gen.WithRequestEditorFn(func(_ context.Context, r *http.Request) error {
			r.Header.Set("Authorization", "Bearer "+key)
			return nil
		}))
	if err != nil {
		return err
	}
	name, noEnv, ttl, preset := "untrusted", true, 900, gen.SizePreset("small")
	created, err := c.CreateSandboxWithResponse(ctx, gen.CreateRequest{Name: &name, NoEnv: &noEnv, TtlSeconds: &ttl, Size: &gen.Size{Preset: &preset}})
	if err != nil {
		return err
	}
	if created.JSON201 == nil {
		return fmt.Errorf("create: HTTP %d: %s", created.StatusCode(), created.Body)
	}
	id := created.JSON201.Id
	defer c.DeleteSandboxWithResponse(context.Background(), id)

	tcp := gen.FirewallRuleProtocol("tcp")
	ports, hosts := "443", []string{"pypi.org", "files.pythonhosted.org"}
	rules := []gen.FirewallRule{{Action: "allow", Protocol: &tcp, Ports: &ports, Hosts: &hosts}}
	if fw, err := c.SetFirewallWithResponse(ctx, id, gen.FirewallPolicy{DefaultOutbound: "deny", Outbound: &rules}); err != nil || fw.JSON200 == nil {
		return fmt.Errorf("firewall: %v %s", err, body(fw))
	}
	job, err := os.ReadFile("examples/untrusted/job.py")
	if err != nil {
		return err
	}
	if w, err := c.WriteFileWithBodyWithResponse(ctx, id, &gen.WriteFileParams{Path: "/home/user/job.py"}, "application/octet-stream", bytes.NewReader(job)); err != nil || w.JSON200 == nil {
		return fmt.Errorf("write: %v %s", err, body(w))
	}
	cmd, timeout := "python3 /home/user/job.py", float32(300)
	r, err := c.ExecWithResponse(ctx, id, gen.ExecRequest{Cmd: &cmd, TimeoutSeconds: &timeout})
	if err != nil || r.JSON200 == nil {
		return fmt.Errorf("exec: %v %s", err, body(r))
	}
	fmt.Println(r.JSON200.ExitCode, r.JSON200.Stdout)
	if d, err := c.DeleteSandboxWithResponse(ctx, id); err != nil || d.StatusCode() != http.StatusOK {
		return fmt.Errorf("delete: %v %s", err, body(d))
	}
	return nil
}

// body is a response's body, for an error message.
func body(r interface{ StatusCode() int }) string {
	if r == nil {
		return ""
	}
	return fmt.Sprintf("HTTP %d", r.StatusCode())
}
