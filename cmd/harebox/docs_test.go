package main

import (
	"bytes"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/harebox/harebox/internal/doccmds"
)

// TestDocsCommands: every harebox command line the README and docs/ show
// names a command that exists, and only flags that command takes (its
// --help lists them).
func TestDocsCommands(t *testing.T) {
	t.Setenv("HAREBOX_URL", "unix:"+filepath.Join(t.TempDir(), "none")) // (a help that called a server would fail)
	helps := map[string]string{}
	help := func(path []string) string {
		k := strings.Join(path, " ")
		if h, ok := helps[k]; ok {
			return h
		}
		var out bytes.Buffer
		run(append(slices.Clone(path), "--help"), strings.NewReader(""), &out, &out)
		helps[k] = out.String()
		return helps[k]
	}
	lines, err := doccmds.Find("../..", "harebox")
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) < 50 {
		t.Fatalf("found %d harebox command lines in the docs: the scan is broken", len(lines))
	}
	// The global flags, from the usage line.
	usage, _, _ := strings.Cut(help(nil), "\n")
	global := doccmds.Flags(strings.NewReplacer("[", " ", "]", " ").Replace(usage))
	word := regexp.MustCompile(`^[a-z][a-z-]*$`)
	for _, l := range lines {
		where := l.File + ": harebox " + l.Args
		toks := doccmds.Fields(l.Args)
		for len(toks) > 0 && strings.HasPrefix(toks[0], "--") { // (global flags first)
			if !strings.Contains(toks[0], "=") {
				toks = toks[1:]
			}
			if len(toks) > 0 {
				toks = toks[1:]
			}
		}
		if len(toks) == 0 {
			continue
		}
		if !slices.ContainsFunc(commands, func(c command) bool { return c.name == toks[0] }) {
			t.Errorf("%s: no command %q", where, toks[0])
			continue
		}
		// The command's words: as long as the next one has a help of its
		// own (a group's subcommand, or a command's first word such as
		// file write).
		path := []string{toks[0]}
		h := help(path)
		for _, tok := range toks[1:] {
			if !word.MatchString(tok) {
				break
			}
			next := append(slices.Clone(path), tok)
			nh := help(next)
			if !strings.HasPrefix(nh, "usage: harebox "+strings.Join(next, " ")) {
				break
			}
			path, h = next, nh
		}
		for _, fl := range doccmds.Flags(l.Args) {
			if !doccmds.Takes(h, fl) && !slices.Contains(global, fl) {
				t.Errorf("%s: harebox %s takes no --%s", where, strings.Join(path, " "), fl)
			}
		}
	}
}
