package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/harebox/harebox/apiclient"
)

// TestHint: the errors a docs page answers point at it, whatever wraps
// them; others get nothing.
func TestHint(t *testing.T) {
	const docs = "https://github.com/harebox/harebox/blob/main/docs/"
	for _, c := range []struct {
		err  error
		want string
	}{
		{&apiclient.Error{Status: 401, Code: "unauthorized", Message: "invalid, expired or revoked API key"}, " (see " + docs + "keys.md)"},
		{fmt.Errorf("list: %w", &apiclient.Error{Status: 403, Code: "forbidden", Message: "the key may not createSandbox"}), " (see " + docs + "keys.md#scoped-keys)"},
		{&apiclient.Error{Status: 400, Code: "invalid", Field: "image", Message: `unknown image "x"`}, " (see " + docs + "images.md#images-on-the-server)"},
		{&apiclient.Error{Status: 400, Code: "invalid", Field: "size", Message: "bad size"}, ""},
		{&apiclient.Error{Status: 404, Code: "not_found", Message: "no sandbox"}, ""},
		{fmt.Errorf("dial tcp: connection refused"), ""},
	} {
		if got := hint(c.err); got != c.want {
			t.Errorf("%v: %q, want %q", c.err, got, c.want)
		}
	}
}

// TestHelp: every command answers --help on stdout with exit 0, without
// reaching a server (none runs here).
func TestHelp(t *testing.T) {
	for _, c := range commands {
		var out, errb bytes.Buffer
		code := run([]string{"--url", "http://127.0.0.1:1", c.name, "--help"}, strings.NewReader(""), &out, &errb)
		if code != 0 || !strings.Contains(out.String()+errb.String(), "sage") {
			t.Errorf("harebox %s --help: exit %d\nstdout: %s\nstderr: %s", c.name, code, out.String(), errb.String())
		}
	}
}
