package main

import (
	"context"
	"flag"
	"strconv"
	"time"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/sandbox"
)

var cmdURL = group("url", []subcommand{
	{"create", "ID --port PORT [--auth token | --auth oidc --issuer URL --audience AUD [--subjects S,...] [--emails E,...] [--groups G,...]]", "publish a port of the sandbox on the server's ingress, behind a token (shown once: here and by rotate) or OpenID Connect ID tokens", urlCreate},
	{"list", "ID", "list the sandbox's URLs", urlList},
	{"get", "ID URL_ID", "show a URL", urlCmd("GET", "")},
	{"rotate", "ID URL_ID", "give a token URL a new token; when this returns the old one is refused and what it opened is cut", urlCmd("POST", "rotate")},
	{"delete", "ID URL_ID", "unpublish a URL", urlCmd("DELETE", "")},
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
	auth := fs.String("auth", sandbox.URLAuthToken, "how clients prove access: token, or oidc (an ID token as Authorization: Bearer)")
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
