package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

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
	doc, err := openapi3.NewLoader().LoadFromFile("openapi.yaml")
	if err != nil {
		f.Fatal(err)
	}
	documented := make([]map[int]bool, len(routes)) // [0]: any error
	for i, rt := range routes {
		for j, b := range bodies {
			f.Add(uint8(i), "", "", []byte(b), uint8(j%3))
		}
		op := operation(doc, rt)
		if op == nil {
			f.Fatalf("%s %s is not in the OpenAPI document", rt.Method, rt.Path)
		}
		// A body made from the operation's request schema, valid in shape.
		if op.RequestBody != nil && op.RequestBody.Value != nil {
			if mt := op.RequestBody.Value.Content.Get("application/json"); mt != nil && mt.Schema != nil {
				if b, err := json.Marshal(sample(mt.Schema.Value, 0)); err == nil {
					f.Add(uint8(i), "", "", b, uint8(0))
					f.Add(uint8(i), "", "", b, uint8(1))
				}
			}
		}
		// The statuses it lists; with a "default" (the JSON error), any
		// error is documented, but a success must still be listed.
		documented[i] = map[int]bool{}
		for code := range op.Responses.Map() {
			if n, err := strconv.Atoi(code); err == nil {
				documented[i][n] = true
			}
		}
		if op.Responses.Default() != nil {
			documented[i][0] = true
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
	// Every path parameter gets a value (one that may name nothing).
	for _, rt := range routes {
		for _, p := range strings.Split(rt.Path, "/") {
			if strings.HasPrefix(p, "{") {
				if _, ok := ids[p]; !ok {
					ids[p] = "x" + strings.Trim(p, "{}")
				}
			}
		}
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
		// On the route itself (no suffix that makes it another path), the
		// status is one the operation documents.
		if doc := documented[int(route)%len(routes)]; suffix == "" && !doc[status] && !(status >= 400 && doc[0]) {
			t.Fatalf("%s %s (%q): %d, which %s does not document", rt.Method, target, body, status, rt.OperationID)
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

// operation is the OpenAPI operation of a route.
func operation(doc *openapi3.T, rt api.Route) *openapi3.Operation {
	item := doc.Paths.Find(rt.Path)
	if item == nil {
		return nil
	}
	return item.GetOperation(rt.Method)
}

// sample makes a value of schema s: every property, the first enum value,
// one item per array (depth-bounded).
func sample(s *openapi3.Schema, depth int) any {
	if s == nil || depth > 6 {
		return nil
	}
	if len(s.Enum) > 0 {
		return s.Enum[0]
	}
	if s.Example != nil {
		return s.Example
	}
	for _, sub := range append(append([]*openapi3.SchemaRef(nil), s.AllOf...), s.OneOf...) {
		if sub.Value != nil {
			return sample(sub.Value, depth+1)
		}
	}
	switch {
	case s.Type.Is("object"):
		m := map[string]any{}
		for name, p := range s.Properties {
			if p.Value != nil && !p.Value.ReadOnly {
				m[name] = sample(p.Value, depth+1)
			}
		}
		if len(m) == 0 && s.AdditionalProperties.Schema != nil {
			m["a"] = sample(s.AdditionalProperties.Schema.Value, depth+1)
		}
		return m
	case s.Type.Is("array"):
		if s.Items != nil {
			return []any{sample(s.Items.Value, depth+1)}
		}
		return []any{}
	case s.Type.Is("integer"), s.Type.Is("number"):
		if s.Min != nil {
			return *s.Min
		}
		return 1
	case s.Type.Is("boolean"):
		return true
	case s.Type.Is("string"):
		if s.MinLength > 0 {
			return strings.Repeat("a", int(s.MinLength))
		}
		return "a"
	}
	return nil
}
