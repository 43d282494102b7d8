package api_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/harebox/harebox/api"
)

// BenchmarkAuthorization: GET /v1/sandboxes/{id} with a scoped key (every
// dimension set) against the same request with the root key, in the same
// run, straight into the handler. Reports the p50 of each, their ratio and
// the difference (the goal is under 50 µs).
func BenchmarkAuthorization(b *testing.B) {
	f := newFastAPI(b, api.Options{})
	w := buildWorld(b, f)
	req := map[string]any{"account_id": "alpha", "scope": map[string]any{
		"actions":  []string{"sandboxes:read", "exec", "files:read"},
		"projects": []string{"web"},
		"labels":   map[string]string{"team": "red"},
		"cidrs":    []string{"127.0.0.0/8", "10.0.0.0/8"},
		"rate":     map[string]any{"per_second": 1e6, "burst": 1e6},
	}}
	_, scoped := f.key(b, f.root, req)
	path := "/v1/sandboxes/" + w.boxA1
	p50 := func(key string, n int) time.Duration {
		d := make([]time.Duration, n)
		for i := range d {
			r := httptest.NewRequest("GET", path, nil)
			r.RemoteAddr = "127.0.0.1:40000"
			r.Header.Set("Authorization", "Bearer "+key)
			rec := httptest.NewRecorder()
			start := time.Now()
			f.srv.ServeHTTP(rec, r)
			d[i] = time.Since(start)
			if rec.Code != http.StatusOK {
				b.Fatalf("%d %s", rec.Code, rec.Body)
			}
		}
		slices.Sort(d)
		return d[n/2]
	}
	p50(f.root, 200) // warm up
	p50(scoped, 200)
	b.ResetTimer()
	var root, key time.Duration
	for range b.N {
		root += p50(f.root, 1000)
		key += p50(scoped, 1000)
	}
	root /= time.Duration(b.N)
	key /= time.Duration(b.N)
	b.ReportMetric(float64(root)/1e3, "root-p50-µs")
	b.ReportMetric(float64(key)/1e3, "key-p50-µs")
	b.ReportMetric(float64(key-root)/1e3, "added-µs")
	b.ReportMetric(float64(key)/float64(root), "key/root")
}
