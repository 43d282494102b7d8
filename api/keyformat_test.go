package api_test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/harebox/harebox/api"
)

// A key made in E2B's form ("e2b_" and hex digits, which E2B's SDKs check
// for) authenticates with the same scopes as any key, and keeps its form
// when rotated; a HareBox key keeps "hbk_".
func TestKeyFormatE2B(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	e2bForm := regexp.MustCompile(`^e2b_[0-9a-f]{96}$`)
	r := f.must(t, http.StatusCreated, "POST", "/v1/keys", f.root, map[string]any{
		"format": "e2b", "scope": map[string]any{"actions": []string{"getInfo"}}})
	secret, id := str(r, "secret"), str(r, "id")
	if !e2bForm.MatchString(secret) || !strings.HasPrefix(str(r, "hint"), "e2b_...") {
		t.Fatalf("an e2b key: secret %q, hint %q", secret, str(r, "hint"))
	}
	f.must(t, http.StatusOK, "GET", "/v1/info", secret, nil)
	// Its scope holds: it may read the info, not list sandboxes.
	f.must(t, http.StatusForbidden, "GET", "/v1/sandboxes", secret, nil)

	r = f.must(t, http.StatusOK, "POST", "/v1/keys/"+id+"/rotate", f.root, nil)
	rotated := str(r, "secret")
	if !e2bForm.MatchString(rotated) || rotated == secret {
		t.Fatalf("rotated: %q", rotated)
	}
	f.must(t, http.StatusUnauthorized, "GET", "/v1/info", secret, nil)
	f.must(t, http.StatusOK, "GET", "/v1/info", rotated, nil)

	// A secret in the form, but not one issued, is refused; so is a
	// changed digit and the same digits upper-cased.
	for _, bad := range []string{
		"e2b_" + strings.Repeat("0", 96),
		rotated[:len(rotated)-1] + map[bool]string{true: "1", false: "0"}[rotated[len(rotated)-1] == '0'],
		"e2b_" + strings.ToUpper(rotated[4:]),
		rotated[:50],
	} {
		f.must(t, http.StatusUnauthorized, "GET", "/v1/info", bad, nil)
	}

	r = f.must(t, http.StatusCreated, "POST", "/v1/keys", f.root, map[string]any{"scope": map[string]any{}})
	if !strings.HasPrefix(str(r, "secret"), "hbk_") {
		t.Errorf("a key of the default form: %q", str(r, "secret"))
	}
	if r := f.do(t, "POST", "/v1/keys", f.root, map[string]any{"format": "aws", "scope": map[string]any{}}); r.status != http.StatusBadRequest || !strings.Contains(string(r.raw), "format") {
		t.Errorf("an unknown format: %d %s", r.status, r.raw)
	}
}
