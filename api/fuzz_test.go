package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/harebox/harebox/api"
)

// FuzzHandlers sends arbitrary requests to every route of a real server
// over the in-memory hypervisor. Whatever the request, the server must not
// panic, must answer a client's mistake with a 4xx (never a 500), and every
// error must be the documented JSON error. Seeds come from the routes and
// the request bodies the OpenAPI document describes.
func FuzzHandlers(f *testing.F) {
	routes := api.Routes()
	bodies := []string{``, `{}`, `null`, `[]`, `{"name": "x"}`, `{"cmd": "echo hi"}`, `{"argv": ["echo", "a"]}`,
		`{"default_outbound": "deny"}`, `{"scope": {"actions": ["exec"]}}`, `{"set": {"A": {"value": "1"}}}`,
		`{"name": "e", "variables": {"S": {"value": "v", "secret": true}}}`, `{"size": {"preset": "huge"}}`,
		`{"environment": "nope@x"}`, `{"labels": {"": ""}}`, `{"ttl_seconds": 1e99}`, `{"third_party_default": "yes"}`,
		"\x00\xff{", `{"scope": {"rate": {"per_second": -1, "burst": 0}}}`}
	for i := range routes {
		for j, b := range bodies {
			f.Add(uint8(i), "", "", []byte(b), uint8(j%3))
		}
	}
	f.Add(uint8(0), "/../../etc/passwd", "path=/etc/passwd", []byte(`{}`), uint8(0))
	f.Add(uint8(5), "x", "state=running&label=a=b&project=%00", []byte(``), uint8(1))

	fa := newFastAPI(f, api.Options{})
	w := buildWorld(f, fa)
	ids := map[string]string{
		"{id}": w.boxA1, "{pid}": "proc_x", "{account}": "alpha", "{project}": "web", "{fleet}": "scrapers",
		"{key}": w.fullKeyID, "{environment}": "prod", "{version}": "1",
	}
	keys := []string{fa.root, w.fullA, ""}
	f.Fuzz(func(t *testing.T, route uint8, suffix, query string, body []byte, key uint8) {
		rt := routes[int(route)%len(routes)]
		path := rt.Path
		for k, v := range ids {
			path = strings.ReplaceAll(path, k, v)
		}
		target := path + suffix
		if query != "" {
			target += "?" + query
		}
		req, err := http.NewRequest(rt.Method, "http://x"+target, bytes.NewReader(body))
		if err != nil {
			return // not a request a client can send
		}
		req.RemoteAddr = "127.0.0.1:40000"
		if k := keys[int(key)%len(keys)]; k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
		rec := httptest.NewRecorder()
		fa.srv.ServeHTTP(rec, req)
		status := rec.Code
		if status >= 500 && status != http.StatusServiceUnavailable && status != http.StatusGatewayTimeout {
			t.Fatalf("%s %s (%q): %d %s", rt.Method, target, body, status, rec.Body)
		}
		if status < 400 || strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream") {
			return
		}
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Code == "" || e.Error.Message == "" {
			t.Fatalf("%s %s (%q): %d with a body that is not the JSON error: %q", rt.Method, target, body, status, rec.Body)
		}
	})
}
