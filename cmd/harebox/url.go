package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/sandbox"
)

var cmdURL = group("url", []subcommand{
	{"create", "ID --port PORT [--auth token | --auth mtls | --auth oidc --issuer URL --audience AUD [--subjects S,...] [--emails E,...] [--groups G,...]]",
		"publish a port of the sandbox on the server's ingress, behind a token (shown once: here and by rotate), OpenID Connect ID tokens, " +
			"or client certificates from the sandbox's project's URL CA (mtls: see url ca and url cert; the host form only)", urlCreate},
	{"list", "ID", "list the sandbox's URLs", urlList},
	{"get", "ID URL_ID", "show a URL", urlCmd("GET", "")},
	{"rotate", "ID URL_ID", "give a token URL a new token; when this returns the old one is refused and what it opened is cut", urlCmd("POST", "rotate")},
	{"delete", "ID URL_ID", "unpublish a URL", urlCmd("DELETE", "")},
	{"ca", "get | create | upload FILE | delete [--project REF] [--account REF]",
		"the project's URL certificate authority: the CA its mtls URLs check client certificates against", nested(cmdURLCA)},
	{"cert", "issue NAME [--ttl DURATION] [--out PREFIX] | list | revoke SERIAL [--project REF] [--account REF]",
		"client certificates for the project's mtls URLs", nested(cmdURLCert)},
})

var cmdURLCA = group("url ca", []subcommand{
	{"get", "[--project REF] [--account REF]", "show the project's URL CA: its certificate (PEM), and whether it was uploaded (not found when the project has none)", urlCAGet},
	{"create", "[--project REF] [--account REF]",
		"make the project a new URL CA in the server (ECDSA P-256, its key sealed there) that url cert issue issues from; " +
			"the old CA's certificates stop working unless the new CA has its key, and what they opened is cut; revocations stay", urlCASet(false)},
	{"upload", "FILE [--project REF] [--account REF]",
		"set the project's URL CA to the CA certificate in FILE (PEM; you issue its client certificates yourself); " +
			"the old CA's certificates stop working unless the new CA has its key, and what they opened is cut; revocations stay", urlCASet(true)},
	{"delete", "[--project REF] [--account REF]",
		"delete the project's URL CA and its key: its mtls URLs refuse every client until a new CA is set (revocations stay)", urlCADelete},
})

var cmdURLCert = group("url cert", []subcommand{
	{"issue", "NAME [--ttl DURATION] [--out PREFIX] [--project REF] [--account REF]",
		"issue a client certificate for NAME (its subject's common name) from the CA the server made; " +
			"its private key is shown once, here (--out writes PREFIX.crt and PREFIX.key)", urlCertIssue},
	{"list", "[--project REF] [--account REF]", "list the certificates the project issued and the serials it revoked, oldest first", urlCertList},
	{"revoke", "SERIAL [--project REF] [--account REF]",
		"revoke a client certificate by its serial (hex); when this returns the project's mtls URLs refuse it and what it opened is cut", urlCertRevoke},
})

const urlHeader = "ID\tPORT\tAUTH\tURL\tPATH_URL\tCREATED"

// urlRows shows a URL, and its token and link when it has them.
func urlRows(u sandbox.URL) [][]string {
	rows := [][]string{{u.ID, strconv.Itoa(u.Port), u.Auth, u.URL, u.PathURL, u.CreatedAt.Format(time.RFC3339)}}
	if u.Token != "" {
		rows = append(rows, []string{"token:", u.Token}, []string{"link:", u.Link})
	}
	return rows
}

func urlCreate(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	port := fs.Int("port", 0, "the guest's TCP port (1-65535)")
	auth := fs.String("auth", sandbox.URLAuthToken, "how clients prove access: token, oidc (an ID token as Authorization: Bearer), "+
		"or mtls (a client certificate signed by the project's URL CA, not revoked: see harebox url ca and harebox url cert)")
	issuer := fs.String("issuer", "", "oidc: the issuer, an https URL")
	audience := fs.String("audience", "", "oidc: the audience (client ID) tokens must be for")
	var subjects, emails, groups list
	fs.Var(&subjects, "subjects", "oidc: subjects allowed (comma-separated, repeatable)")
	fs.Var(&emails, "emails", "oidc: emails allowed (comma-separated, repeatable)")
	fs.Var(&groups, "groups", "oidc: groups allowed (comma-separated, repeatable)")
	pos, err := exactly(fs, c, args, "ID")
	if err != nil {
		return 0, err
	}
	req := sandbox.URLRequest{Port: *port, Auth: *auth}
	if *issuer != "" || *audience != "" || len(subjects)+len(emails)+len(groups) > 0 {
		req.OIDC = &sandbox.OIDCRule{Issuer: *issuer, Audience: *audience, Subjects: subjects, Emails: emails, Groups: groups}
	}
	var u sandbox.URL
	if err := c.c.Do(ctx, "POST", apiclient.Path("sandboxes", pos[0], "urls"), nil, req, &u); err != nil {
		return 0, err
	}
	return 0, c.show(u, urlHeader, urlRows(u))
}

func urlList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	pos, err := exactly(fs, c, args, "ID")
	if err != nil {
		return 0, err
	}
	var out struct {
		URLs []sandbox.URL `json:"urls"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.Path("sandboxes", pos[0], "urls"), nil, nil, &out); err != nil {
		return 0, err
	}
	var rows [][]string
	for _, u := range out.URLs {
		rows = append(rows, urlRows(u)...)
	}
	return 0, c.show(out, urlHeader, rows)
}

func urlCmd(method, action string) func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	return func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
		pos, err := exactly(fs, c, args, "ID", "URL_ID")
		if err != nil {
			return 0, err
		}
		path := apiclient.Path("sandboxes", pos[0], "urls", pos[1])
		if action != "" {
			path = apiclient.Path("sandboxes", pos[0], "urls", pos[1], action)
		}
		if method == "DELETE" {
			return 0, c.c.Do(ctx, method, path, nil, nil, nil)
		}
		var u sandbox.URL
		if err := c.c.Do(ctx, method, path, nil, nil, &u); err != nil {
			return 0, err
		}
		return 0, c.show(u, urlHeader, urlRows(u))
	}
}

// The project's URL certificate authority and its client certificates.

const urlCAHeader = "PROJECT\tUPLOADED\tCREATED"

// printURLCA prints a CA: as JSON, or in a table followed by its
// certificate (PEM).
func (c *cli) printURLCA(ca sandbox.URLCA) error {
	if c.output == "json" {
		return c.json(ca)
	}
	if err := c.table(urlCAHeader, [][]string{{ca.ProjectID, yesNo(ca.Uploaded), when(&ca.CreatedAt)}}); err != nil {
		return err
	}
	fmt.Fprintln(c.stdout)
	return c.pem(ca.Certificate)
}

// pem prints PEM text, ending in a newline.
func (c *cli) pem(s string) error {
	if s != "" && !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	_, err := io.WriteString(c.stdout, s)
	return err
}

func urlCAGet(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	var ca sandbox.URLCA
	if err := c.c.Do(ctx, "GET", apiclient.Path("url-ca"), query(), nil, &ca); err != nil {
		return 0, err
	}
	return 0, c.printURLCA(ca)
}

// urlCASet is url ca upload FILE (a CA certificate to upload) or, without
// a file, url ca create (an empty request: the server makes a new CA).
func urlCASet(upload bool) func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	return func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
		query := envFlags(fs)
		var names []string
		if upload {
			names = []string{"FILE"}
		}
		pos, err := exactly(fs, c, args, names...)
		if err != nil {
			return 0, err
		}
		var req sandbox.URLCARequest
		if upload {
			b, err := os.ReadFile(pos[0])
			if err != nil {
				return 0, usageError{err.Error()}
			}
			// An empty certificate would be no certificate: the server
			// would make a new CA instead of taking this one.
			if strings.TrimSpace(string(b)) == "" {
				return 0, usageError{fmt.Sprintf("%s is empty (want a CA certificate, PEM)", pos[0])}
			}
			req.Certificate = string(b)
		}
		var ca sandbox.URLCA
		if err := c.c.Do(ctx, "PUT", apiclient.Path("url-ca"), query(), req, &ca); err != nil {
			return 0, err
		}
		return 0, c.printURLCA(ca)
	}
}

func urlCADelete(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	q := query()
	if err := c.c.Do(ctx, "DELETE", apiclient.Path("url-ca"), q, nil, nil); err != nil {
		return 0, err
	}
	project := q.Get("project")
	if c.output == "json" {
		out := map[string]string{"deleted": "url-ca"}
		if project != "" {
			out["project"] = project
		}
		return 0, c.json(out)
	}
	if project == "" {
		_, err := fmt.Fprintln(c.stdout, "deleted the URL CA of the default project")
		return 0, err
	}
	_, err := fmt.Fprintf(c.stdout, "deleted the URL CA of project %s\n", project)
	return 0, err
}

const certHeader = "SERIAL\tNAME\tISSUED\tNOT_AFTER\tREVOKED_AT"

func certRow(cert sandbox.ClientCert) []string {
	return []string{cert.Serial, dash(cert.Name), yesNo(cert.Issued), when(cert.NotAfter), when(cert.RevokedAt)}
}

// issuedFiles is url cert issue --out's JSON: the certificate's record
// (without its PEM and key) and the files they were written to.
type issuedFiles struct {
	sandbox.ClientCert
	CertificateFile string `json:"certificate_file"`
	KeyFile         string `json:"key_file"`
}

func urlCertIssue(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	ttl := fs.String("ttl", "", "how long the certificate is valid, a Go duration such as 720h (default 2160h, at most 8760h)")
	out := fs.String("out", "", "write the certificate to PREFIX.crt (mode 0644) and its private key to PREFIX.key (mode 0600) instead of printing them; neither file may exist")
	pos, err := exactly(fs, c, args, "NAME")
	if err != nil {
		return 0, err
	}
	if *ttl != "" {
		if d, err := time.ParseDuration(*ttl); err != nil || d <= 0 {
			return 0, usageError{fmt.Sprintf("--ttl %q: want a positive Go duration such as 720h", *ttl)}
		}
	}
	// The files are made before the certificate is issued: a name taken
	// fails here, not after the server made a key with nowhere to go.
	var crtFile, keyFile *os.File
	if *out != "" {
		if crtFile, err = os.OpenFile(*out+".crt", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); err != nil {
			return 0, usageError{"--out: " + err.Error()}
		}
		if keyFile, err = os.OpenFile(*out+".key", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
			crtFile.Close()
			os.Remove(crtFile.Name())
			return 0, usageError{"--out: " + err.Error()}
		}
	}
	discard := func() {
		for _, f := range []*os.File{crtFile, keyFile} {
			if f != nil {
				f.Close()
				os.Remove(f.Name())
			}
		}
	}
	var cert sandbox.ClientCert
	req := sandbox.ClientCertRequest{Name: pos[0], TTL: *ttl}
	if err := c.c.Do(ctx, "POST", apiclient.Path("url-ca", "certs"), query(), req, &cert); err != nil {
		discard()
		return 0, err
	}
	if cert.Certificate == "" || cert.PrivateKey == "" {
		discard()
		return 0, fmt.Errorf("the server's answer has no certificate or key (serial %s)", dash(cert.Serial))
	}
	if *out == "" {
		if c.output == "json" {
			return 0, c.json(cert)
		}
		if err := c.table(certHeader, [][]string{certRow(cert)}); err != nil {
			return 0, err
		}
		fmt.Fprintln(c.stdout)
		if err := c.pem(cert.Certificate); err != nil {
			return 0, err
		}
		return 0, c.pem(cert.PrivateKey)
	}
	// The server keeps neither the key nor the certificate's PEM: one
	// without the other is of no use.
	if err := errors.Join(writeClose(crtFile, cert.Certificate), writeClose(keyFile, cert.PrivateKey)); err != nil {
		os.Remove(crtFile.Name())
		os.Remove(keyFile.Name())
		return 0, fmt.Errorf("%v; certificate %s was issued but not saved: revoke it (harebox url cert revoke %s)", err, cert.Serial, cert.Serial)
	}
	files := issuedFiles{ClientCert: cert, CertificateFile: crtFile.Name(), KeyFile: keyFile.Name()}
	files.Certificate, files.PrivateKey = "", ""
	if c.output == "json" {
		return 0, c.json(files)
	}
	return 0, c.table(certHeader, [][]string{certRow(cert), {"certificate:", files.CertificateFile}, {"key:", files.KeyFile}})
}

// writeClose writes s to f and closes it.
func writeClose(f *os.File, s string) error {
	_, err := io.WriteString(f, s)
	return errors.Join(err, f.Close())
}

func urlCertList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	var out struct {
		Certs []sandbox.ClientCert `json:"certs"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.Path("url-ca", "certs"), query(), nil, &out); err != nil {
		return 0, err
	}
	if out.Certs == nil {
		out.Certs = []sandbox.ClientCert{} // none: [], not null
	}
	var rows [][]string
	for _, cert := range out.Certs {
		rows = append(rows, certRow(cert))
	}
	return 0, c.show(out, certHeader, rows)
}

func urlCertRevoke(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	pos, err := exactly(fs, c, args, "SERIAL")
	if err != nil {
		return 0, err
	}
	var cert sandbox.ClientCert
	if err := c.c.Do(ctx, "POST", apiclient.Path("url-ca", "certs", pos[0], "revoke"), query(), nil, &cert); err != nil {
		return 0, err
	}
	return 0, c.show(cert, certHeader, [][]string{certRow(cert)})
}
