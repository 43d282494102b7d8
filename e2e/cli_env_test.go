package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/testserver"
)

// TestCLIEnv is the CLI's contract for environments (harebox env), the
// project's third-party default (harebox project update) and harebox new
// --env NAME / --third-party, against a real hareboxd that boots no VM. A
// secret given with --secret-from-env must appear in no output and no
// answer, nor in plain text in the data directory.
func TestCLIEnv(t *testing.T) {
	s := testserver.PrepareNoVM(t)
	dataDir, err := os.MkdirTemp("", "hbe")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.StartNoVM(t, s, dataDir)
	defer func() {
		srv.Stop(t)
		testserver.NoLeftovers(t, dataDir)
	}()

	// The secret is only in the CLI's own environment, as TOKEN.
	const canary = "sk-live-cli-canary-0123456789abcdef"
	var seen strings.Builder // every output of the CLI, and every answer
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(filepath.Join(s.Bin, "harebox"), args...)
		cmd.Env = append(srv.Env(s), "TOKEN="+canary)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		if err := cmd.Run(); err != nil && cmd.ProcessState == nil {
			t.Fatal(err)
		}
		seen.WriteString(o.String() + e.String())
		return o.String(), e.String(), cmd.ProcessState.ExitCode()
	}
	ok := func(out any, args ...string) string {
		t.Helper()
		o, e, code := cli(args...)
		if code != 0 {
			t.Fatalf("harebox %s: exit %d\nstdout: %s\nstderr: %s\nserver log:\n%s", strings.Join(args, " "), code, o, e, testserver.Tail(srv.Log.String()))
		}
		if out != nil {
			if err := json.Unmarshal([]byte(o), out); err != nil {
				t.Fatalf("harebox %s: %v\n%s", strings.Join(args, " "), err, o)
			}
		}
		return o
	}
	fails := func(code int, want string, args ...string) string {
		t.Helper()
		o, e, got := cli(args...)
		if got != code || o != "" || strings.Count(strings.TrimSpace(e), "\n") != 0 || !strings.HasPrefix(e, "harebox") || !strings.Contains(e, want) {
			t.Errorf("harebox %s: exit %d, stdout %q, stderr %q; want exit %d and one line with %q", strings.Join(args, " "), got, o, e, code, want)
		}
		return e
	}
	// api GETs a path with the root key and returns the raw answer.
	api := func(path string) string {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+srv.Key)
		resp, err := srv.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		seen.Write(b)
		return string(b)
	}

	type envVar struct {
		Value  string `json:"value"`
		Secret bool   `json:"secret"`
	}
	type version struct {
		EnvironmentID  string            `json:"environment_id"`
		Version        int               `json:"version"`
		ThirdPartySafe bool              `json:"third_party_safe"`
		Variables      map[string]envVar `json:"variables"`
		Files          []struct {
			Path     string `json:"path"`
			Content  string `json:"content"`
			Template bool   `json:"template"`
		} `json:"files"`
		Credentials []struct {
			Secret string   `json:"secret"`
			Hosts  []string `json:"hosts"`
			Ports  string   `json:"ports"`
			Header string   `json:"header"`
			Format string   `json:"format"`
		} `json:"credentials"`
	}
	type environment struct {
		ID      string   `json:"id"`
		Name    string   `json:"name"`
		Project string   `json:"project"`
		Latest  int      `json:"latest"`
		Version *version `json:"version"`
	}
	local := t.TempDir()
	conf := filepath.Join(local, "app.conf")
	motd := filepath.Join(local, "motd")
	os.WriteFile(conf, []byte("mode={{MODE}} token={{ TOKEN }}\n"), 0o644)
	os.WriteFile(motd, []byte("hello\n"), 0o644)

	// Create: a plain variable, a secret from the CLI's environment, a
	// template, a file and a credential rule.
	var prod environment
	ok(&prod, "env", "create", "prod", "--var", "MODE=prod", "--var", "EXTRA=x", "--secret-from-env", "TOKEN",
		"--template-file", "/etc/app.conf="+conf, "--file", "/etc/motd="+motd,
		"--credential", "TOKEN=api.example.test:443;header=Authorization;format=Bearer {value}")
	v := prod.Version
	if !strings.HasPrefix(prod.ID, "env_") || prod.Name != "prod" || prod.Project != "default" || prod.Latest != 1 || v == nil ||
		v.Version != 1 || v.ThirdPartySafe || v.Variables["MODE"] != (envVar{Value: "prod"}) || v.Variables["TOKEN"] != (envVar{Secret: true}) ||
		len(v.Files) != 2 || v.Files[0].Path != "/etc/app.conf" || !v.Files[0].Template || v.Files[1].Content != "hello\n" || v.Files[1].Template ||
		len(v.Credentials) != 1 || v.Credentials[0].Secret != "TOKEN" || v.Credentials[0].Hosts[0] != "api.example.test" ||
		v.Credentials[0].Ports != "443" || v.Credentials[0].Header != "Authorization" || v.Credentials[0].Format != "Bearer {value}" {
		t.Fatalf("env create: %+v %+v", prod, v)
	}
	fails(1, "exists", "env", "create", "prod", "--var", "A=b")
	// Another environment, in another project, third-party safe.
	ok(nil, "project", "create", "web")
	var staging environment
	if ok(&staging, "env", "create", "staging", "--project", "web", "--var", "A=1", "--third-party-safe"); staging.Project != "web" || !staging.Version.ThirdPartySafe {
		t.Errorf("env create --project web: %+v", staging)
	}

	// Get, by name and by ID; list per project.
	for _, ref := range []string{"prod", prod.ID} {
		var got environment
		if ok(&got, "env", "get", ref); got.ID != prod.ID || got.Latest != 1 || got.Version.Variables["TOKEN"] != (envVar{Secret: true}) {
			t.Errorf("env get %s: %+v", ref, got)
		}
	}
	fails(1, "no environment", "env", "get", "staging") // in web, not default
	var list struct{ Environments []environment }
	if ok(&list, "env", "list"); len(list.Environments) != 1 || list.Environments[0].ID != prod.ID {
		t.Errorf("env list: %+v", list)
	}
	if ok(&list, "env", "list", "--project", "web", "--account", "default"); len(list.Environments) != 1 || list.Environments[0].ID != staging.ID {
		t.Errorf("env list --project web: %+v", list)
	}
	o := ok(nil, "--output", "table", "env", "list")
	if lines := strings.Split(strings.TrimSpace(o), "\n"); len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME LATEST PROJECT UPDATED" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "prod 1 default 20") {
		t.Errorf("env list table:\n%s", o)
	}
	o = ok(nil, "--output", "table", "env", "get", "prod")
	if !strings.HasPrefix(o, "ID ") || !strings.Contains(o, prod.ID) || !strings.Contains(o, "VARIABLE") ||
		!regexpLine(o, "TOKEN (secret)") || !regexpLine(o, "MODE prod") || !strings.Contains(o, "/etc/app.conf") || !strings.Contains(o, "Bearer {value}") {
		t.Errorf("env get table:\n%s", o)
	}

	// Set makes version 2; version 1 stays as it was.
	var e2 environment
	if ok(&e2, "env", "set", "prod", "--var", "MODE=staging"); e2.Latest != 2 || e2.Version.Version != 2 ||
		e2.Version.Variables["MODE"].Value != "staging" || e2.Version.Variables["TOKEN"] != (envVar{Secret: true}) || len(e2.Version.Files) != 2 {
		t.Errorf("env set: %+v", e2)
	}
	var v1, v2 version
	if ok(&v1, "env", "version", "prod", "1"); v1.Version != 1 || v1.Variables["MODE"].Value != "prod" || v1.EnvironmentID != prod.ID {
		t.Errorf("env version prod 1: %+v", v1)
	}
	if ok(&v2, "env", "version", prod.ID, "2"); v2.Version != 2 || v2.Variables["MODE"].Value != "staging" {
		t.Errorf("env version prod 2: %+v", v2)
	}
	// Unset: MODE is in the template, so the server refuses; EXTRA goes.
	fails(1, "MODE", "env", "set", "prod", "--unset", "MODE")
	var e3 environment
	if ok(&e3, "env", "set", "prod", "--unset", "EXTRA", "--third-party-safe"); e3.Latest != 3 || !e3.Version.ThirdPartySafe {
		t.Errorf("env set --unset EXTRA --third-party-safe: %+v", e3)
	} else if _, has := e3.Version.Variables["EXTRA"]; has || len(e3.Version.Variables) != 2 {
		t.Errorf("env set --unset EXTRA: %+v", e3.Version.Variables)
	}
	if ok(&e3, "env", "set", "prod", "--third-party-safe=false"); e3.Latest != 4 || e3.Version.ThirdPartySafe {
		t.Errorf("env set --third-party-safe=false: %+v", e3)
	}
	var vs struct{ Versions []version }
	if ok(&vs, "env", "versions", "prod"); len(vs.Versions) != 4 || vs.Versions[0].Version != 1 || vs.Versions[3].Version != 4 || !vs.Versions[2].ThirdPartySafe {
		t.Errorf("env versions: %+v", vs)
	}
	o = ok(nil, "--output", "table", "env", "versions", "prod")
	if !strings.HasPrefix(o, "VERSION ") || strings.Count(strings.TrimSpace(o), "\n") != 4 || !strings.Contains(o, "TOKEN(secret)") {
		t.Errorf("env versions table:\n%s", o)
	}
	if o = ok(nil, "--output", "table", "env", "version", "prod", "1"); !regexpLine(o, "MODE prod") || !regexpLine(o, "TOKEN (secret)") {
		t.Errorf("env version table:\n%s", o)
	}
	fails(1, "no version 9", "env", "version", "prod", "9")

	// The secret appears in no answer, however it is asked for.
	for _, p := range []string{"/v1/environments", "/v1/environments/prod", "/v1/environments/prod/versions",
		"/v1/environments/" + prod.ID + "/versions/1", "/v1/environments/prod/versions/4"} {
		if a := api(p); !strings.Contains(a, `"TOKEN":{"secret":true}`) {
			t.Errorf("GET %s: %s", p, a)
		}
	}

	// The project's third-party default.
	var prj struct {
		Name              string `json:"name"`
		ThirdPartyDefault bool   `json:"third_party_default"`
	}
	if ok(&prj, "project", "update", "default", "--third-party-default=true"); prj.Name != "default" || !prj.ThirdPartyDefault {
		t.Errorf("project update: %+v", prj)
	}
	if ok(&prj, "project", "get", "default"); !prj.ThirdPartyDefault {
		t.Errorf("project get after update: %+v", prj)
	}
	if o := ok(nil, "--output", "table", "project", "update", "web", "--third-party-default"); !strings.Contains(o, "THIRD-PARTY-DEFAULT") || !regexpLine(o, "web * yes") {
		t.Errorf("project update table:\n%s", o)
	}
	if ok(&prj, "project", "update", "default", "--third-party-default=false", "--account", "default"); prj.ThirdPartyDefault {
		t.Errorf("project update back: %+v", prj)
	}
	fails(1, "no project", "project", "update", "nope", "--third-party-default=true")

	// harebox new --env: this server has no image.
	line := fails(1, "", "new", "--env", "nope")
	t.Logf("new --env nope, no image: %s", strings.TrimSpace(line))
	line = fails(1, "", "new", "--env", "prod", "--third-party")
	t.Logf("new --env prod --third-party, no image: %s", strings.TrimSpace(line))
	// With an image the engine finds (a manifest over empty files: nothing
	// boots, every create below is refused first), the environment is
	// checked.
	fake := filepath.Join(dataDir, "no-images", "default-fake")
	os.MkdirAll(fake, 0o755)
	os.WriteFile(filepath.Join(fake, "vmlinuz"), nil, 0o644)
	os.WriteFile(filepath.Join(fake, "initrd"), nil, 0o644)
	manifest, _ := json.Marshal(images.Image{Name: "default", Kernel: "vmlinuz", Initrd: "initrd", InputHash: "fake", BuiltAt: time.Now()})
	os.WriteFile(filepath.Join(fake, images.ManifestFile), manifest, 0o644)
	fails(1, `no environment "nope"`, "new", "--env", "nope")
	fails(1, "no version 9", "new", "--env", "prod@9")
	fails(1, "third_party_safe", "new", "--env", "prod", "--third-party")
	fails(1, "third_party_safe", "new", "--env", prod.ID+"@4", "--third-party", "--env", "K=V")
	os.RemoveAll(fake)
	fails(2, "at most one environment", "new", "--env", "prod", "--env", "staging")

	// Delete.
	if o := ok(nil, "env", "delete", "prod"); !strings.Contains(o, `"deleted": "prod"`) {
		t.Errorf("env delete: %s", o)
	}
	fails(1, "no environment", "env", "get", "prod")
	fails(1, "no environment", "env", "versions", prod.ID)
	if o := ok(nil, "--output", "table", "env", "delete", "staging", "--project", "web"); o != "deleted environment staging\n" {
		t.Errorf("env delete table: %q", o)
	}
	if ok(&list, "env", "list", "--project", "web"); len(list.Environments) != 0 {
		t.Errorf("env list after delete: %+v", list)
	}

	// Usage errors are one line and exit 2.
	t.Setenv("EMPTY_ONE", "")
	for _, args := range [][]string{
		{"env"}, {"env", "frobnicate"}, {"env", "create"}, {"env", "create", "a", "b"}, {"env", "create", "x", "--bogus"},
		{"env", "create", "x", "--var", "NOEQUALS"}, {"env", "create", "x", "--secret", "NOEQUALS"},
		{"env", "create", "x", "--secret-from-env", "HAREBOX_TEST_UNSET_VARIABLE"}, {"env", "create", "x", "--secret-from-env", "EMPTY_ONE"},
		{"env", "create", "x", "--var", "TOKEN=a", "--secret-from-env", "TOKEN"},
		{"env", "create", "x", "--file", "/etc/x"}, {"env", "create", "x", "--file", "/etc/x=" + filepath.Join(local, "missing")},
		{"env", "create", "x", "--credential", "TOKEN"}, {"env", "create", "x", "--credential", "TOKEN=a.test;bogus=1"},
		{"env", "create", "x", "--credential", "TOKEN=a.test;format=x"},
		{"env", "set", "x"}, {"env", "set"}, {"env", "set", "x", "--third-party-safe=maybe"},
		{"env", "set", "x", "--var", "A=1", "--unset", "A"}, {"env", "set", "x", "--no-files", "--file", "/a=" + motd},
		{"env", "get"}, {"env", "list", "extra"}, {"env", "versions"}, {"env", "version", "x"}, {"env", "version", "x", "0"},
		{"env", "version", "x", "one"}, {"env", "delete"},
		{"project", "update", "default"}, {"project", "update"}, {"project", "update", "default", "--third-party-default=maybe"},
		{"new", "--env", ""}, {"new", "--env", "a", "--env", "b@2"},
	} {
		fails(2, "usage: harebox", args...)
	}
	// A malformed --secret is not repeated in the error.
	if e := fails(2, "--secret", "env", "create", "x", "--secret", canary); strings.Contains(e, canary) {
		t.Errorf("the malformed --secret is repeated: %s", e)
	}

	// --help on every new command and subcommand, and the new flags.
	for _, args := range [][]string{
		{"env", "--help"}, {"env", "create", "--help"}, {"env", "set", "--help"}, {"env", "get", "--help"}, {"env", "list", "--help"},
		{"env", "versions", "--help"}, {"env", "version", "--help"}, {"env", "delete", "--help"},
		{"project", "--help"}, {"project", "update", "--help"}, {"new", "--help"}, {"--help"},
	} {
		o, e, code := cli(args...)
		if code != 0 || o != "" || !strings.HasPrefix(e, "usage: harebox") {
			t.Errorf("harebox %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, o, e)
		}
		var want []string
		switch strings.Join(args, " ") {
		case "env --help":
			want = []string{"create", "set", "get", "list", "versions", "version", "delete"}
		case "env create --help":
			want = []string{"-var", "-secret", "-secret-from-env", "-file", "-template-file", "-credential", "-third-party-safe", "-project", "-account"}
		case "env set --help":
			want = []string{"-var", "-secret-from-env", "-unset", "-third-party-safe", "-no-files", "-no-credentials", "-project", "-account"}
		case "env get --help", "env list --help", "env versions --help", "env version --help", "env delete --help":
			want = []string{"-project", "-account"}
		case "project --help":
			want = []string{"update"}
		case "project update --help":
			want = []string{"-third-party-default", "-account"}
		case "new --help":
			want = []string{"-third-party", "NAME[@VERSION]", "KEY=VALUE"}
		case "--help":
			want = []string{"\n  env "}
		}
		for _, w := range want {
			if !strings.Contains(e, w) {
				t.Errorf("harebox %s lacks %q:\n%s", strings.Join(args, " "), w, e)
			}
		}
	}

	// The secret was in no output and no answer, and is nowhere in plain
	// text on the server's disk.
	if strings.Contains(seen.String(), canary) {
		t.Errorf("the secret's value was shown")
	}
	filepath.Walk(dataDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(canary)) {
				t.Errorf("the secret is in plain text in %s", p)
			}
		}
		return nil
	})
}

// regexpLine reports whether a line of out has the words of want, in
// order, separated by any spaces ("*" matches one word).
func regexpLine(out, want string) bool {
	w := strings.Fields(want)
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		for i := 0; i+len(w) <= len(f); i++ {
			match := true
			for j := range w {
				if w[j] != "*" && w[j] != f[i+j] {
					match = false
					break
				}
			}
			if match {
				return true
			}
		}
	}
	return false
}
