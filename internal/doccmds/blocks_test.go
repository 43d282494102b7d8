package doccmds

import (
	"os"
	"strings"
	"testing"
)

// TestBlocks: every code block of the README and docs/ says its language,
// and every example a user could paste (shell, Python, TypeScript,
// JavaScript) is either run by e2e/docs TestExamples or says why not.
func TestBlocks(t *testing.T) {
	blocks, err := Blocks("../..")
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) < 30 {
		t.Fatalf("found %d code blocks: the scan is broken", len(blocks))
	}
	examples := map[string]bool{"sh": true, "python": true, "ts": true, "js": true}
	other := map[string]bool{"go": true, "json": true, "yaml": true, "text": true}
	for _, b := range blocks {
		switch {
		case !examples[b.Lang] && !other[b.Lang]:
			t.Errorf("%s: a block of language %q: want one of sh, python, ts, js, go, json, yaml, text", b.Where(), b.Lang)
		case b.NotRun != "" && !examples[b.Lang]:
			t.Errorf("%s: a %s block is never run: it needs no \"not run\"", b.Where(), b.Lang)
		case strings.Contains(b.Code, "```"):
			t.Errorf("%s: a fence inside a block", b.Where())
		}
	}
}

func TestBlocksParse(t *testing.T) {
	dir := t.TempDir()
	page := "# A page\n\n```sh\necho one\n```\n\n<!-- not run: it needs a domain -->\n\n```sh\necho two\n```\n"
	writeFile(t, dir+"/README.md", page)
	bs, err := Blocks(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 2 || bs[0].Code != "echo one\n" || bs[0].NotRun != "" || bs[0].Line != 3 ||
		bs[1].NotRun != "it needs a domain" || bs[1].Lang != "sh" || bs[1].Where() != "README.md:9" {
		t.Fatalf("blocks: %+v", bs)
	}
	writeFile(t, dir+"/README.md", "```sh\necho open\n")
	if _, err := Blocks(dir); err == nil || !strings.Contains(err.Error(), "no end") {
		t.Fatalf("an open block: %v", err)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
