package docslink

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestPagesExist: every page an error points at is a file of docs/, and
// its anchor a heading there (GitHub's slug: lower case, spaces to
// hyphens, punctuation dropped).
func TestPagesExist(t *testing.T) {
	punct := regexp.MustCompile(`[^a-z0-9 _-]`)
	for _, page := range []string{Keys, ScopedKeys, Images, TLS, E2B} {
		file, anchor, _ := strings.Cut(page, "#")
		b, err := os.ReadFile(filepath.Join("..", "..", "docs", file))
		if err != nil {
			t.Errorf("%s: %v", page, err)
			continue
		}
		if anchor == "" {
			continue
		}
		found := false
		for _, l := range strings.Split(string(b), "\n") {
			if h, ok := strings.CutPrefix(strings.TrimLeft(l, "#"), " "); ok && strings.HasPrefix(l, "#") {
				slug := strings.ReplaceAll(punct.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
				found = found || slug == anchor
			}
		}
		if !found {
			t.Errorf("%s: docs/%s has no heading #%s", page, file, anchor)
		}
	}
	if got := See(TLS); got != " (see https://github.com/harebox/harebox/blob/main/docs/deploy.md#tls)" {
		t.Errorf("See: %q", got)
	}
}
