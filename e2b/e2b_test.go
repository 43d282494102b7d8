package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/e2b"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/hypervisor/voldisk"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// These tests run the control plane over a real engine (the in-memory
// hypervisor, a SQLite store, sealed secrets) and real keys.

type fixture struct {
	eng *harebox.Engine
	db  *store.DB
	sec secrets.Store
	h   *e2b.Handler
	url string
	// key is a key of the default account with every action.
	key string
}

func newFixture(t *testing.T) *fixture { return newFixtureWith(t, nil) }

// newFixtureWith is newFixture with the engine's and the handler's
// options changed by set.
func newFixtureWith(t *testing.T, set func(*harebox.Options, *e2b.Options)) *fixture {
	t.Helper()
	ctx := context.Background()
	// (Short: the in-memory guests' sockets live in it.)
	dir, err := os.MkdirTemp("", "hbe2b")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	db, err := store.OpenSQLite(ctx, filepath.Join(dir, "harebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	sec, err := secrets.NewSealed(db, filepath.Join(dir, "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	eo := harebox.Options{
		DataDir: dir, Hypervisor: hv, Store: db, Secrets: sec,
		Images:   map[string]images.Image{sandbox.DefaultImage: memhv.Image(dir)},
		Capacity: harebox.Capacity{VCPUs: 64, MemoryMB: 65536, DiskGB: 1000},
	}
	var ho e2b.Options
	if set != nil {
		set(&eo, &ho)
	}
	eng, err := harebox.New(ctx, eo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	ho.Engine, ho.Secrets = eng, sec
	h := e2b.New(ho)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	f := &fixture{eng: eng, db: db, sec: sec, h: h, url: srv.URL}
	f.key = f.newKey(t, authz.Scope{})
	return f
}

// newKey issues a key of the default account (as the operator).
func (f *fixture) newKey(t *testing.T, scope authz.Scope) string {
	t.Helper()
	k, err := f.eng.Keys().Create(context.Background(), apikey.CreateRequest{Scope: scope, Format: "e2b"})
	if err != nil {
		t.Fatal(err)
	}
	return k.Secret
}

type reply struct {
	status int
	header http.Header
	raw    []byte
}

func (r reply) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.raw, v); err != nil {
		t.Fatalf("%v in %s", err, r.raw)
	}
}

func (f *fixture) do(t *testing.T, method, path, key string, body any) reply {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		raw, _ := json.Marshal(b)
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequest(method, f.url+path, rd)
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, raw}
}

func (f *fixture) must(t *testing.T, want int, method, path, key string, body any) reply {
	t.Helper()
	r := f.do(t, method, path, key, body)
	if r.status != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, r.status, r.raw, want)
	}
	return r
}

// e2bError checks that r is E2B's error body with status want.
func e2bError(t *testing.T, r reply, want int, contains string) {
	t.Helper()
	var e struct {
		Code    *int    `json:"code"`
		Message *string `json:"message"`
	}
	if r.status != want || json.Unmarshal(r.raw, &e) != nil || e.Code == nil || *e.Code != want || e.Message == nil ||
		!strings.Contains(*e.Message, contains) {
		t.Fatalf("got %d %s, want E2B's error %d with %q", r.status, r.raw, want, contains)
	}
}

func (f *fixture) create(t *testing.T, key string, body map[string]any) e2b.Sandbox {
	t.Helper()
	if body["templateID"] == nil {
		body["templateID"] = "base"
	}
	var s e2b.Sandbox
	f.must(t, 201, "POST", "/sandboxes", key, body).decode(t, &s)
	return s
}

func (f *fixture) engineView(t *testing.T, id string) *sandbox.Sandbox {
	t.Helper()
	s, err := f.eng.Get(context.Background(), e2b.InternalID(id))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Both create paths make a sandbox of the template's image, TTL and
// metadata, with its own envd token; the token checks in constant time
// against that sandbox only.
func TestCreate(t *testing.T) {
	f := newFixture(t)
	var made []e2b.Sandbox
	for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
		var s e2b.Sandbox
		f.must(t, 201, "POST", path, f.key, map[string]any{
			"templateID": "base", "timeout": 300, "metadata": map[string]string{"user": "abc"},
			"envVars": map[string]string{"MODE": "test"}, "secure": true,
		}).decode(t, &s)
		if !dnsLabel.MatchString(s.SandboxID) || s.TemplateID != "base" || s.EnvdVersion != e2b.EnvdVersion || s.ClientID == "" {
			t.Errorf("%s: %+v", path, s)
		}
		if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(s.EnvdAccessToken) {
			t.Errorf("%s: envd token %q", path, s.EnvdAccessToken)
		}
		box := f.engineView(t, s.SandboxID)
		if box.State != sandbox.StateRunning || box.Image != sandbox.DefaultImage || box.Labels["user"] != "abc" {
			t.Errorf("%s: the engine's sandbox %+v", path, box)
		}
		if d := time.Until(*box.ExpiresAt); d < 290*time.Second || d > 300*time.Second {
			t.Errorf("%s: expires in %v, want 300 s", path, d)
		}
		made = append(made, s)
	}
	ctx := context.Background()
	a, b := made[0], made[1]
	if a.EnvdAccessToken == b.EnvdAccessToken {
		t.Error("two sandboxes got one token")
	}
	if err := f.h.VerifyAccessToken(ctx, a.SandboxID, a.EnvdAccessToken); err != nil {
		t.Errorf("its own token: %v", err)
	}
	for _, bad := range []string{b.EnvdAccessToken, "", a.EnvdAccessToken[:63], a.EnvdAccessToken + "0"} {
		if err := f.h.VerifyAccessToken(ctx, a.SandboxID, bad); !errors.Is(err, sandbox.ErrUnauthenticated) {
			t.Errorf("token %q: %v", bad, err)
		}
	}
	// What is stored is sealed: not the token in the clear.
	raw, err := f.sec.Get(ctx, sandboxkeys.Scope(e2b.InternalID(a.SandboxID)), "e2b-envd-access-token")
	if err != nil || bytes.Contains(raw, []byte(a.EnvdAccessToken)) {
		t.Errorf("stored token: %v, in the clear: %v", err, bytes.Contains(raw, []byte(a.EnvdAccessToken)))
	}

	// No internet: the host firewall denies every outbound connection.
	c := f.create(t, f.key, map[string]any{"allow_internet_access": false})
	p, err := f.eng.Firewall(ctx, e2b.InternalID(c.SandboxID))
	if err != nil || p.DefaultOutbound != firewall.Deny || len(p.Outbound) != 0 {
		t.Errorf("allow_internet_access false: %+v %v", p, err)
	}
}

// E2B's network rules are the host firewall's, in E2B's order: allowOut
// (addresses, then names) before denyOut, then the default; an update
// replaces them, and clears what it leaves out.
func TestNetworkRules(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.create(t, f.key, map[string]any{"network": map[string]any{
		"allowOut": []string{"*.example.com", "8.8.8.8", "10.1.0.0/16", "api.example.org"},
		"denyOut":  []string{"0.0.0.0/0"}, "allowPublicTraffic": false}})
	want := &firewall.Policy{DefaultOutbound: firewall.Allow, Outbound: []firewall.Rule{
		{Action: firewall.Allow, CIDRs: []string{"8.8.8.8/32", "10.1.0.0/16"}},
		{Action: firewall.Allow, Hosts: []string{"*.example.com", "api.example.org"}},
		{Action: firewall.Deny, CIDRs: []string{"0.0.0.0/0"}},
	}}
	if err := want.Normalize(); err != nil {
		t.Fatal(err)
	}
	got, err := f.eng.Firewall(ctx, e2b.InternalID(s.SandboxID))
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("the host firewall: %+v %v\nwant %+v", got, err, want)
	}

	// An update replaces the rules; no internet is a default deny.
	path := "/sandboxes/" + s.SandboxID + "/network"
	f.must(t, 204, "PUT", path, f.key, map[string]any{"allowOut": []string{"1.1.1.1"}, "allow_internet_access": false})
	want = &firewall.Policy{DefaultOutbound: firewall.Deny, Outbound: []firewall.Rule{{Action: firewall.Allow, CIDRs: []string{"1.1.1.1/32"}}}}
	want.Normalize()
	if got, err = f.eng.Firewall(ctx, e2b.InternalID(s.SandboxID)); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("after an update: %+v %v", got, err)
	}
	// Left out is cleared: all open again.
	f.must(t, 204, "PUT", path, f.key, map[string]any{})
	if got, err = f.eng.Firewall(ctx, e2b.InternalID(s.SandboxID)); err != nil || got.DefaultOutbound != firewall.Allow || len(got.Outbound) != 0 {
		t.Fatalf("after an empty update: %+v %v", got, err)
	}
	// Refused: a bad entry (the rules stay), no body, another key's
	// sandbox, a key that may not set the firewall.
	e2bError(t, f.do(t, "PUT", path, f.key, map[string]any{"denyOut": []string{"*.example.com"}}), 400, "denyOut")
	e2bError(t, f.do(t, "PUT", path, f.key, nil), 400, "body")
	e2bError(t, f.do(t, "PUT", "/sandboxes/"+strings.Repeat("0", 26)+"/network", f.key, map[string]any{}), 404, "")
	ro := f.newKey(t, authz.Scope{Actions: []string{"sandboxes:read", "sandboxes:write"}})
	e2bError(t, f.do(t, "PUT", path, ro, map[string]any{"denyOut": []string{"0.0.0.0/0"}}), 403, "")
	if got, _ = f.eng.Firewall(ctx, e2b.InternalID(s.SandboxID)); len(got.Outbound) != 0 {
		t.Errorf("a refused update changed the rules: %+v", got)
	}
}

// Metrics: the host's samples in E2B's shape, CPU from two samples'
// CPU time, an interval of Unix seconds.
func TestMetrics(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.create(t, f.key, map[string]any{})
	id := e2b.InternalID(s.SandboxID)
	box := f.engineView(t, s.SandboxID)
	t0 := time.Unix(time.Now().Unix()-100, 0)
	for i, cpu := range []float64{2, 2.5, 3.5} {
		if err := f.db.PutMetrics(ctx, &store.MetricSample{SandboxID: id, AccountID: box.AccountID, Time: t0.Add(time.Duration(i) * 2 * time.Second),
			CPUSeconds: cpu, MemoryBytes: 300 << 20, DiskBytes: 1 << 30}); err != nil {
			t.Fatal(err)
		}
	}
	var got []e2b.Metric
	f.must(t, 200, "GET", "/sandboxes/"+s.SandboxID+"/metrics", f.key, nil).decode(t, &got)
	if len(got) != 3 || got[0].CPUUsedPct != 0 || got[1].CPUUsedPct != 25 || got[2].CPUUsedPct != 50 ||
		got[1].TimestampUnix != t0.Unix()+2 || got[1].CPUCount != int32(box.Size.VCPUs) || got[1].MemUsed != 300<<20 ||
		got[1].MemTotal != int64(box.Size.MemoryMB)<<20 || got[1].DiskUsed != 1<<30 || got[1].DiskTotal != int64(box.Size.DiskGB)<<30 {
		t.Fatalf("metrics: %+v", got)
	}
	// An interval: end is inclusive.
	q := "?start=" + strconv.FormatInt(t0.Unix()+1, 10) + "&end=" + strconv.FormatInt(t0.Unix()+2, 10)
	f.must(t, 200, "GET", "/sandboxes/"+s.SandboxID+"/metrics"+q, f.key, nil).decode(t, &got)
	if len(got) != 1 || got[0].TimestampUnix != t0.Unix()+2 {
		t.Errorf("metrics from t0+1 to t0+2: %+v", got)
	}
	e2bError(t, f.do(t, "GET", "/sandboxes/"+s.SandboxID+"/metrics?start=yesterday", f.key, nil), 400, "start")
	e2bError(t, f.do(t, "GET", "/sandboxes/"+strings.Repeat("0", 26)+"/metrics", f.key, nil), 404, "")
	files := f.newKey(t, authz.Scope{Actions: []string{"files:read"}})
	e2bError(t, f.do(t, "GET", "/sandboxes/"+s.SandboxID+"/metrics", files, nil), 403, "")
}

// What HareBox cannot do as asked is E2B's 400, and nothing is made.
func TestCreateRefused(t *testing.T) {
	f := newFixture(t)
	for name, c := range map[string]struct {
		body map[string]any
		msg  string
	}{
		"unknown template": {map[string]any{"templateID": "nope"}, "template 'nope' not found"},
		"no template":      {map[string]any{"timeout": 10}, "templateID is required"},
		"metadata key":     {map[string]any{"templateID": "base", "metadata": map[string]string{"bad key!": "x"}}, `metadata key "bad key!"`},
		"metadata value":   {map[string]any{"templateID": "base", "metadata": map[string]string{"k": strings.Repeat("v", 257)}}, `metadata key "k"`},
		"env name":         {map[string]any{"templateID": "base", "envVars": map[string]string{"1X": "x"}}, `envVars key "1X"`},
		"negative timeout": {map[string]any{"templateID": "base", "timeout": -1}, "timeout"},
		"too long":         {map[string]any{"templateID": "base", "timeout": 2592001}, "timeout"},
		"a denied domain":  {map[string]any{"templateID": "base", "network": map[string]any{"denyOut": []string{"example.com"}}}, "domain names are not supported"},
		"a bad host":       {map[string]any{"templateID": "base", "network": map[string]any{"allowOut": []string{"exa mple.com"}}}, "network"},
		"transforms":       {map[string]any{"templateID": "base", "network": map[string]any{"rules": map[string]any{"api.example.com": []any{map[string]any{}}}}}, "network.rules"},
		"an egress proxy":  {map[string]any{"templateID": "base", "network": map[string]any{"egressProxy": map[string]any{"address": "p:1080"}}}, "egressProxy"},
		"a host mask":      {map[string]any{"templateID": "base", "network": map[string]any{"maskRequestHost": "x"}}, "maskRequestHost"},
		"network not JSON": {map[string]any{"templateID": "base", "network": []int{1}}, "network"},
		"auto-pause":       {map[string]any{"templateID": "base", "autoPause": true}, "autoPause"},
		"not JSON":         {nil, "invalid JSON"},
	} {
		t.Run(name, func(t *testing.T) {
			var body any = c.body
			if c.body == nil {
				body = "{templateID"
			}
			e2bError(t, f.do(t, "POST", "/v2/sandboxes", f.key, body), 400, c.msg)
		})
	}
	if l, err := f.eng.List(context.Background(), sandbox.ListFilter{}); err != nil || len(l) != 0 {
		t.Errorf("refused creates made sandboxes: %v %v", l, err)
	}
}

// E2B's volumes are HareBox volumes: made, listed, got and deleted
// through E2B's paths, mounted at create by volumeMounts (shown in the
// sandbox's info), refused while mounted; an unknown one is E2B's 404,
// and the content API says it is not served.
func TestVolumes(t *testing.T) {
	if err := (voldisk.Tools{}).Check(); err != nil {
		t.Skip(err)
	}
	f := newFixture(t)
	var v e2b.VolumeAndToken
	f.must(t, 201, "POST", "/volumes", f.key, map[string]string{"name": "data"}).decode(t, &v)
	if v.Name != "data" || v.VolumeID == "" {
		t.Fatalf("created %+v", v)
	}
	var l []e2b.Volume
	f.must(t, 200, "GET", "/volumes", f.key, nil).decode(t, &l)
	if len(l) != 1 || l[0].VolumeID != v.VolumeID {
		t.Errorf("listed %+v", l)
	}
	f.must(t, 200, "GET", "/volumes/"+v.VolumeID, f.key, nil)
	s := f.create(t, f.key, map[string]any{"volumeMounts": []map[string]string{{"name": "data", "path": "/mnt/data"}}})
	var d e2b.SandboxDetail
	f.must(t, 200, "GET", "/sandboxes/"+s.SandboxID, f.key, nil).decode(t, &d)
	if len(d.VolumeMounts) != 1 || d.VolumeMounts[0].Path != "/mnt/data" {
		t.Errorf("the sandbox's volumeMounts: %+v", d.VolumeMounts)
	}
	e2bError(t, f.do(t, "DELETE", "/volumes/"+v.VolumeID, f.key, nil), 409, "attached")
	e2bError(t, f.do(t, "POST", "/v2/sandboxes", f.key, map[string]any{"templateID": "base", "volumeMounts": []map[string]string{{"name": "nope", "path": "/v"}}}), 404, "no volume")
	e2bError(t, f.do(t, "GET", "/volumecontent/"+v.VolumeID+"/dir?path=/", f.key, nil), 400, "not served")
	f.must(t, 204, "DELETE", "/sandboxes/"+s.SandboxID, f.key, nil)
	f.must(t, 204, "DELETE", "/volumes/"+v.VolumeID, f.key, nil)
	e2bError(t, f.do(t, "GET", "/volumes/"+v.VolumeID, f.key, nil), 404, "")
}

// No key, a wrong key, or a key in the Authorization header only: E2B's
// 401.
func TestBadKey(t *testing.T) {
	f := newFixture(t)
	e2bError(t, f.do(t, "GET", "/v2/sandboxes", "", nil), 401, "X-API-KEY")
	e2bError(t, f.do(t, "GET", "/v2/sandboxes", "e2b_"+strings.Repeat("0", 96), nil), 401, "")
	e2bError(t, f.do(t, "POST", "/sandboxes", f.key+"0", map[string]any{"templateID": "base"}), 401, "")
	req, _ := http.NewRequest("GET", f.url+"/sandboxes", nil)
	req.Header.Set("Authorization", "Bearer "+f.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("bearer only: %d", resp.StatusCode)
	}
	e2bError(t, f.do(t, "GET", "/no/such/thing", f.key, nil), 404, "no such endpoint")
}

// Pause stops the timeout; connect resumes a paused sandbox (201) with
// the timeout asked for, and a running one is 200 with its TTL only
// extended; the token stays the create's.
func TestPauseConnect(t *testing.T) {
	f := newFixture(t)
	s := f.create(t, f.key, map[string]any{"timeout": 30})
	path := "/sandboxes/" + s.SandboxID
	f.must(t, 204, "POST", path+"/pause", f.key, nil)
	e2bError(t, f.do(t, "POST", path+"/pause", f.key, nil), 409, "paused")
	box := f.engineView(t, s.SandboxID)
	if box.State != sandbox.StatePaused || box.ExpiresAt != nil {
		t.Fatalf("paused: %s, expires %v", box.State, box.ExpiresAt)
	}
	var d e2b.SandboxDetail
	f.must(t, 200, "GET", path, f.key, nil).decode(t, &d)
	if d.State != e2b.StatePaused {
		t.Errorf("info of a paused sandbox: %+v", d)
	}

	e2bError(t, f.do(t, "POST", path+"/connect", f.key, map[string]any{"timeout": -1}), 400, "timeout")
	var c e2b.Sandbox
	f.must(t, 201, "POST", "/v2"+path+"/connect", f.key, map[string]any{"timeout": 60}).decode(t, &c)
	box = f.engineView(t, s.SandboxID)
	if box.State != sandbox.StateRunning || box.ExpiresAt == nil || time.Until(*box.ExpiresAt) < 50*time.Second {
		t.Fatalf("connected: %s, expires %v", box.State, box.ExpiresAt)
	}
	if c.SandboxID != s.SandboxID || c.EnvdAccessToken != s.EnvdAccessToken {
		t.Errorf("connect: %+v, want the create's ID and token", c)
	}
	// Running: 200, and a shorter timeout does not shorten it.
	exp := *box.ExpiresAt
	f.must(t, 200, "POST", path+"/connect", f.key, map[string]any{"timeout": 5})
	if got := *f.engineView(t, s.SandboxID).ExpiresAt; !got.Equal(exp) {
		t.Errorf("connect shortened the TTL: %v -> %v", exp, got)
	}
	f.must(t, 200, "POST", path+"/connect", f.key, map[string]any{"timeout": 600})
	exp = *f.engineView(t, s.SandboxID).ExpiresAt
	if time.Until(exp) < 590*time.Second {
		t.Errorf("connect did not extend the TTL: %v", exp)
	}
	// No timeout (SDKs from 2.51 send none when the caller gives none):
	// a running sandbox keeps its own.
	f.must(t, 200, "POST", "/v2"+path+"/connect", f.key, map[string]any{})
	if got := *f.engineView(t, s.SandboxID).ExpiresAt; !got.Equal(exp) {
		t.Errorf("a connect without a timeout changed the TTL: %v -> %v", exp, got)
	}

	// The deprecated resume: 409 when running, 201 when paused.
	e2bError(t, f.do(t, "POST", path+"/resume", f.key, map[string]any{"timeout": 60}), 409, "running")
	f.must(t, 204, "POST", path+"/pause", f.key, nil)
	f.must(t, 201, "POST", path+"/resume", f.key, map[string]any{"timeout": 60})
	if st := f.engineView(t, s.SandboxID).State; st != sandbox.StateRunning {
		t.Errorf("resumed: %s", st)
	}
}

// Info has the sandbox's size, times, metadata and state; a missing or
// unknown ID is E2B's 404.
func TestInfo(t *testing.T) {
	f := newFixture(t)
	s := f.create(t, f.key, map[string]any{"timeout": 120, "metadata": map[string]string{"app": "web"}})
	var d e2b.SandboxDetail
	r := f.must(t, 200, "GET", "/sandboxes/"+s.SandboxID, f.key, nil)
	r.decode(t, &d)
	box := f.engineView(t, s.SandboxID)
	if d.SandboxID != s.SandboxID || d.TemplateID != "base" || d.State != e2b.StateRunning || d.Metadata["app"] != "web" ||
		d.CPUCount != int32(box.Size.VCPUs) || d.MemoryMB != int32(box.Size.MemoryMB) || d.DiskSizeMB != int32(box.Size.DiskGB*1024) ||
		!d.StartedAt.Equal(box.CreatedAt) || !d.EndAt.Equal(*box.ExpiresAt) || d.EnvdAccessToken != s.EnvdAccessToken ||
		d.Lifecycle.OnTimeout != "kill" || d.EnvdVersion != e2b.EnvdVersion {
		t.Errorf("info %s", r.raw)
	}
	// The HareBox form of the ID works too.
	f.must(t, 200, "GET", "/sandboxes/"+e2b.InternalID(s.SandboxID), f.key, nil)
	e2bError(t, f.do(t, "GET", "/sandboxes/01jx0000000000000000000000", f.key, nil), 404, "")
	e2bError(t, f.do(t, "GET", "/sandboxes/nonsense", f.key, nil), 404, "")

	// A key that may read but not run commands gets no envd token.
	ro := f.newKey(t, authz.Scope{Actions: []string{"sandboxes:read"}})
	var d2 e2b.SandboxDetail
	f.must(t, 200, "GET", "/sandboxes/"+s.SandboxID, ro, nil).decode(t, &d2)
	if d2.SandboxID != s.SandboxID || d2.EnvdAccessToken != "" {
		t.Errorf("a read-only key's info: %+v", d2)
	}
}

func ids(l []e2b.ListedSandbox) []string {
	var out []string
	for _, s := range l {
		out = append(out, s.SandboxID)
	}
	return out
}

// Lists filter by metadata and state; v2 pages by X-Next-Token, newest
// first, every sandbox once.
func TestList(t *testing.T) {
	f := newFixture(t)
	var all, teamA []string
	for i := 0; i < 5; i++ {
		team := "a"
		if i%2 == 1 {
			team = "b"
		}
		s := f.create(t, f.key, map[string]any{"metadata": map[string]string{"team": team, "n": string(rune('0' + i))}, "timeout": 600})
		all = append(all, s.SandboxID)
		if team == "a" {
			teamA = append(teamA, s.SandboxID)
		}
	}
	f.must(t, 204, "POST", "/sandboxes/"+teamA[0]+"/pause", f.key, nil)
	slices.Reverse(all) // newest first
	slices.Reverse(teamA)

	list := func(path string) ([]string, reply) {
		t.Helper()
		var l []e2b.ListedSandbox
		r := f.must(t, 200, "GET", path, f.key, nil)
		r.decode(t, &l)
		return ids(l), r
	}
	meta := url.QueryEscape("team=a")
	if got, r := list("/v2/sandboxes?metadata=" + meta); !slices.Equal(got, teamA) || r.header.Get("X-Total-Running") != "2" {
		t.Errorf("team a: %v (running %q), want %v", got, r.header.Get("X-Total-Running"), teamA)
	}
	if got, _ := list("/v2/sandboxes?state=paused"); !slices.Equal(got, teamA[len(teamA)-1:]) {
		t.Errorf("paused: %v, want %v", got, teamA[len(teamA)-1:])
	}
	if got, _ := list("/v2/sandboxes?state=running&metadata=" + meta); !slices.Equal(got, teamA[:2]) {
		t.Errorf("team a running: %v, want %v", got, teamA[:2])
	}
	if got, _ := list("/v2/sandboxes?metadata=" + url.QueryEscape("team=a&n=2")); !slices.Equal(got, []string{all[2]}) {
		t.Errorf("team a, n 2: %v, want %v", got, all[2:3])
	}
	// v1: the running ones.
	if got, _ := list("/sandboxes?metadata=" + meta); !slices.Equal(got, teamA[:2]) {
		t.Errorf("v1 team a: %v, want the running %v", got, teamA[:2])
	}
	// Pages of two, newest first, then oldest first.
	for _, order := range []string{"desc", "asc"} {
		want := slices.Clone(all)
		if order == "asc" {
			slices.Reverse(want)
		}
		var got []string
		next, pages := "", 0
		for {
			path := "/v2/sandboxes?limit=2&order=" + order
			if next != "" {
				path += "&nextToken=" + url.QueryEscape(next)
			}
			page, r := list(path)
			got = append(got, page...)
			pages++
			if next = r.header.Get("X-Next-Token"); next == "" {
				break
			}
			if pages > 5 {
				t.Fatal("pagination does not end")
			}
		}
		if !slices.Equal(got, want) || pages != 3 {
			t.Errorf("%s pages: %v in %d pages, want %v in 3", order, got, pages, want)
		}
	}
	e2bError(t, f.do(t, "GET", "/v2/sandboxes?state=stopped", f.key, nil), 400, "state")
	e2bError(t, f.do(t, "GET", "/v2/sandboxes?limit=101", f.key, nil), 400, "limit")
	e2bError(t, f.do(t, "GET", "/v2/sandboxes?nextToken=garbage", f.key, nil), 400, "nextToken")
}

// Kill deletes the sandbox and its token; it is then E2B's 404.
func TestKill(t *testing.T) {
	f := newFixture(t)
	s := f.create(t, f.key, map[string]any{})
	f.must(t, 204, "DELETE", "/sandboxes/"+s.SandboxID, f.key, nil)
	if st := f.engineView(t, s.SandboxID).State; st != sandbox.StateDeleted {
		t.Errorf("killed: %s", st)
	}
	e2bError(t, f.do(t, "GET", "/sandboxes/"+s.SandboxID, f.key, nil), 404, "")
	e2bError(t, f.do(t, "DELETE", "/sandboxes/"+s.SandboxID, f.key, nil), 404, "")
	e2bError(t, f.do(t, "POST", "/sandboxes/"+s.SandboxID+"/connect", f.key, map[string]any{"timeout": 10}), 404, "")
	if err := f.h.VerifyAccessToken(context.Background(), s.SandboxID, s.EnvdAccessToken); err == nil {
		t.Error("a killed sandbox's token still verifies")
	}
	if _, err := f.sec.Get(context.Background(), sandboxkeys.Scope(e2b.InternalID(s.SandboxID)), "e2b-envd-access-token"); !errors.Is(err, secrets.ErrNotFound) {
		t.Errorf("a killed sandbox's token is still stored: %v", err)
	}
}

// A sandbox deleted another way (its TTL here) leaves no token that
// verifies: its data key, which sealed it, is gone.
func TestTimeout(t *testing.T) {
	f := newFixture(t)
	s := f.create(t, f.key, map[string]any{"timeout": 3600})
	path := "/sandboxes/" + s.SandboxID + "/timeout"
	e2bError(t, f.do(t, "POST", path, f.key, map[string]any{"timeout": -5}), 400, "timeout")
	e2bError(t, f.do(t, "POST", path, f.key, map[string]any{}), 400, "timeout")
	f.must(t, 204, "POST", path, f.key, map[string]any{"timeout": 1})
	deadline := time.Now().Add(10 * time.Second)
	for f.engineView(t, s.SandboxID).State != sandbox.StateDeleted {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox did not expire")
		}
		time.Sleep(100 * time.Millisecond)
	}
	e2bError(t, f.do(t, "GET", "/sandboxes/"+s.SandboxID, f.key, nil), 404, "")
	if err := f.h.VerifyAccessToken(context.Background(), s.SandboxID, s.EnvdAccessToken); err == nil {
		t.Error("an expired sandbox's token still verifies")
	}
}

// A key limited to one project sees, lists, times and kills only that
// project's sandboxes; it creates in it.
func TestProjectKey(t *testing.T) {
	f := newFixture(t)
	p, err := f.eng.Tenants().CreateProject(context.Background(), "", tenant.CreateRequest{Name: "web"})
	if err != nil {
		t.Fatal(err)
	}
	web := f.newKey(t, authz.Scope{Projects: []string{p.ID}})
	mine := f.create(t, web, map[string]any{})
	other := f.create(t, f.key, map[string]any{})
	if got := f.engineView(t, mine.SandboxID).ProjectID; got != p.ID {
		t.Errorf("created in project %s, want %s", got, p.ID)
	}
	var l []e2b.ListedSandbox
	f.must(t, 200, "GET", "/v2/sandboxes", web, nil).decode(t, &l)
	if got := ids(l); !slices.Equal(got, []string{mine.SandboxID}) {
		t.Errorf("the project key lists %v, want only %s", got, mine.SandboxID)
	}
	f.must(t, 200, "GET", "/sandboxes", f.key, nil).decode(t, &l)
	if len(l) != 2 {
		t.Errorf("the account's key lists %v, want both", ids(l))
	}
	op := "/sandboxes/" + other.SandboxID
	e2bError(t, f.do(t, "GET", op, web, nil), 404, "")
	e2bError(t, f.do(t, "POST", op+"/timeout", web, map[string]any{"timeout": 1}), 404, "")
	e2bError(t, f.do(t, "POST", op+"/pause", web, nil), 404, "")
	e2bError(t, f.do(t, "POST", op+"/connect", web, map[string]any{"timeout": 10}), 404, "")
	e2bError(t, f.do(t, "DELETE", op, web, nil), 404, "")
	if st := f.engineView(t, other.SandboxID).State; st != sandbox.StateRunning {
		t.Errorf("the other project's sandbox is %s", st)
	}
	f.must(t, 204, "DELETE", "/sandboxes/"+mine.SandboxID, web, nil)

	// A key without sandboxes:write may not create: E2B's 403.
	ro := f.newKey(t, authz.Scope{Actions: []string{"sandboxes:read"}})
	e2bError(t, f.do(t, "POST", "/sandboxes", ro, map[string]any{"templateID": "base"}), 403, "")
}

// Snapshots and fork through E2B's calls: a snapshot is a template (by
// ID or name), a fork's sandboxes come with their own tokens, and a
// snapshot is deleted as a template.
func TestSnapshotsAndFork(t *testing.T) {
	f := newFixture(t)
	s := f.create(t, f.key, map[string]any{"metadata": map[string]string{"role": "source"}})
	var sn e2b.SnapshotInfo
	f.must(t, 201, "POST", "/sandboxes/"+s.SandboxID+"/snapshots", f.key, map[string]any{"name": "snap-one"}).decode(t, &sn)
	if !sandbox.ValidSnapshotID(sn.SnapshotID) || !slices.Equal(sn.Names, []string{"snap-one"}) {
		t.Fatalf("snapshot: %+v", sn)
	}
	var other e2b.SnapshotInfo
	f.must(t, 201, "POST", "/sandboxes/"+s.SandboxID+"/snapshots", f.key, nil).decode(t, &other)
	e2bError(t, f.do(t, "POST", "/sandboxes/"+s.SandboxID+"/snapshots", f.key, map[string]any{"name": "snap-one"}), 409, "")

	// Listed newest first, by sandbox, by name, a page at a time.
	var page []e2b.SnapshotInfo
	r := f.must(t, 200, "GET", "/snapshots?sandboxID="+s.SandboxID+"&limit=1", f.key, nil)
	r.decode(t, &page)
	if len(page) != 1 || page[0].SnapshotID != other.SnapshotID || r.header.Get("X-Next-Token") != other.SnapshotID {
		t.Fatalf("first page: %+v %v", page, r.header)
	}
	f.must(t, 200, "GET", "/snapshots?sandboxID="+s.SandboxID+"&nextToken="+other.SnapshotID, f.key, nil).decode(t, &page)
	if len(page) != 1 || page[0].SnapshotID != sn.SnapshotID {
		t.Fatalf("second page: %+v", page)
	}
	f.must(t, 200, "GET", "/snapshots?name=snap-one", f.key, nil).decode(t, &page)
	if len(page) != 1 || page[0].SnapshotID != sn.SnapshotID {
		t.Fatalf("by name: %+v", page)
	}
	e2bError(t, f.do(t, "GET", "/snapshots?nextToken=x", f.key, nil), 400, "nextToken")

	// A template: by ID and by name; the source's labels come along.
	for _, tmpl := range []string{sn.SnapshotID, "snap-one"} {
		c := f.create(t, f.key, map[string]any{"templateID": tmpl})
		if v := f.engineView(t, c.SandboxID); v.Labels["role"] != "source" || c.EnvdAccessToken == "" {
			t.Errorf("from %s: %+v", tmpl, v)
		}
	}

	// Fork: two sandboxes, each its own token, with the timeout asked.
	var forks []struct {
		Sandbox *e2b.Sandbox `json:"sandbox"`
		Error   *e2b.Error   `json:"error"`
	}
	f.must(t, 201, "POST", "/sandboxes/"+s.SandboxID+"/fork", f.key, map[string]any{"count": 2, "timeout": 120}).decode(t, &forks)
	if len(forks) != 2 || forks[0].Sandbox == nil || forks[1].Sandbox == nil || forks[0].Sandbox.EnvdAccessToken == forks[1].Sandbox.EnvdAccessToken {
		t.Fatalf("fork: %+v", forks)
	}
	for _, fk := range forks {
		v := f.engineView(t, fk.Sandbox.SandboxID)
		if v.ExpiresAt == nil || time.Until(*v.ExpiresAt) > 121*time.Second || f.h.VerifyAccessToken(context.Background(), fk.Sandbox.SandboxID, fk.Sandbox.EnvdAccessToken) != nil {
			t.Errorf("a fork: %+v", v)
		}
	}
	e2bError(t, f.do(t, "POST", "/sandboxes/"+s.SandboxID+"/fork", f.key, map[string]any{"count": 17}), 400, "count")
	e2bError(t, f.do(t, "POST", "/sandboxes/"+strings.Repeat("0", 26)+"/fork", f.key, nil), 404, "")

	// Deleted as a template; a template that is not a snapshot is not.
	f.must(t, 204, "DELETE", "/templates/"+sn.SnapshotID, f.key, nil)
	e2bError(t, f.do(t, "DELETE", "/templates/"+sn.SnapshotID, f.key, nil), 404, "")
	e2bError(t, f.do(t, "DELETE", "/templates/base", f.key, nil), 404, "")
	e2bError(t, f.do(t, "POST", "/v2/sandboxes", f.key, map[string]any{"templateID": "snap-one"}), 400, "template")
}

// An envd token's principal may do every file call (a new one in the
// files groups is envd's too) and each process call envd's process
// service makes (envd.Processes), on its sandbox only.
func TestEnvdPrincipal(t *testing.T) {
	f := newFixture(t)
	s := f.create(t, f.key, map[string]any{})
	p, err := f.h.Principal(context.Background(), s.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Concat(authz.Groups["files:read"], authz.Groups["files:write"],
		[]string{"startProcess", "listProcesses", "getProcessOutput", "sendProcessInput", "killProcess"})
	for _, a := range want {
		if err := authz.Allowed(p, a); err != nil {
			t.Errorf("an envd token may not %s: %v", a, err)
		}
	}
	for _, a := range []string{"createSandbox", "deleteSandbox", "setFirewall", "createKey", "createSnapshot"} {
		if authz.Allowed(p, a) == nil {
			t.Errorf("an envd token may %s", a)
		}
	}
	if p.KeyID != "envd:"+e2b.InternalID(s.SandboxID) || !slices.Equal(p.Scope.Sandboxes, []string{e2b.InternalID(s.SandboxID)}) {
		t.Errorf("principal: %+v", p)
	}
	f.must(t, 204, "POST", "/sandboxes/"+s.SandboxID+"/pause", f.key, nil)
	if _, err := f.h.Principal(context.Background(), s.SandboxID); err == nil {
		t.Error("a paused sandbox's envd has a principal")
	}
}
