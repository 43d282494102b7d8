// Package docslink names the documentation pages the commands' errors
// point at (hareboxd's and harebox's), where a page answers what the error
// leaves open: how to build a missing image, how to serve over TLS, what a
// key may do.
package docslink

// Base is where the docs pages are published: the docs/ directory of the
// project's repository.
const Base = "https://github.com/harebox/harebox/blob/main/docs/"

// Pages (a file of docs/, with a heading's anchor where one fits).
const (
	Keys       = "keys.md"
	ScopedKeys = "keys.md#scoped-keys"
	Images     = "images.md#images-on-the-server"
	TLS        = "deploy.md#tls"
	E2B        = "e2b.md"
)

// See is " (see URL)" for a page: what an error appends.
func See(page string) string { return " (see " + Base + page + ")" }
