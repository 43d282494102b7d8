// Package console is the web console hareboxd serves at /console: its
// page and assets, and the browser sessions it signs in with.
//
// The assets are built from web/ (TypeScript, bundled by esbuild from npm,
// its lock file committed) into dist/, which is committed too, so that a
// plain go build embeds them; make builds them again, and a test fails
// when dist/ is not what web/ builds to. The page uses only the public REST
// API; everything it shows is rendered as text, never as markup.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed dist
var dist embed.FS

// Path is where the console is served.
const Path = "/console/"

// Policy is the Content Security Policy of the console's page: its own
// script and style only (no inline ones, no other origin), never framed.
const Policy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; " +
	"connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Handler serves the page at Path and its assets at Path+"assets/", with
// the console's security headers; /console redirects to Path.
func Handler() http.Handler {
	files, _ := fs.Sub(dist, "dist")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == strings.TrimSuffix(Path, "/") {
			http.Redirect(w, r, Path, http.StatusMovedPermanently)
			return
		}
		name := "index.html"
		if rest, ok := strings.CutPrefix(r.URL.Path, Path+"assets/"); ok {
			name = path.Clean(rest)
		} else if r.URL.Path != Path {
			http.NotFound(w, r)
			return
		}
		b, err := fs.ReadFile(files, name)
		if err != nil || strings.Contains(name, "/") {
			http.NotFound(w, r)
			return
		}
		SecurityHeaders(w.Header())
		w.Header().Set("Content-Type", contentType(name))
		w.Header().Set("Cache-Control", "no-cache")
		w.Write(b)
	})
}

// SecurityHeaders sets the headers every console response carries.
func SecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", Policy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
}

func contentType(name string) string {
	switch path.Ext(name) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	}
	return "application/octet-stream"
}
