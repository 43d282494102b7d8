package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocsCommands: every harebox command line the README and docs/ show
// (in code blocks and inline code) names a command that exists, and only
// flags that command takes (its --help lists them): a command or flag
// renamed or removed fails here, not in a reader's shell.
func TestDocsCommands(t *testing.T) {
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md")
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
	t.Setenv("HAREBOX_URL", "unix:"+filepath.Join(t.TempDir(), "none")) // (a help that called a server would fail)
	// The global flags, from the usage line.
	var global []string
	for _, m := range flagName.FindAllStringSubmatch(firstLine(help(nil)), -1) {
		global = append(global, m[1])
	}
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, inv := range invocations(string(b)) {
			n++
			where := filepath.Base(f) + ": harebox " + inv
			toks := strings.Fields(unquote(inv))
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
			// The command's words: as long as the next one has a help
			// of its own (a group's subcommand, or a command's first
			// word such as file write).
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
			for _, fl := range flagsOf(inv) {
				if !takes(h, fl) && !slices.Contains(global, fl) {
					t.Errorf("%s: harebox %s takes no --%s", where, strings.Join(path, " "), fl)
				}
			}
		}
	}
	if n < 50 {
		t.Fatalf("found %d harebox command lines in the docs: the scan is broken", n)
	}
}

var (
	fence      = regexp.MustCompile("(?s)```[a-z]*\n(.*?)```")
	inlineCode = regexp.MustCompile("`([^`\n]+)`")
	// A command line: harebox at the start, or after a shell's $( or ;
	// or && or a prompt.
	harebox = regexp.MustCompile(`(?:^|\$\(|[;&|]\s*|\$ )harebox\s+([a-z$"-][^\n]*)`)
	word    = regexp.MustCompile(`^[a-z][a-z-]*$`)
	// Where a command line ends: a pipe into another program, a
	// subshell's end, a list, a comment, the start of the guest's own
	// arguments.
	lineEnd  = regexp.MustCompile(`\|\s*[a-z]|\)|;|&&|\s#|\s--(\s|$)`)
	flagName = regexp.MustCompile(`(?:^|[\s\[|(])--([a-z][a-z0-9-]*)`)
	quoted   = regexp.MustCompile(`'[^']*'|"[^"]*"`)
)

// invocations are the arguments of each harebox command line in a
// Markdown text: lines of its code blocks (a trailing \ joins the next),
// and its inline code.
func invocations(md string) []string {
	var lines []string
	for _, m := range fence.FindAllStringSubmatch(md, -1) {
		lines = append(lines, strings.Split(strings.ReplaceAll(m[1], "\\\n", " "), "\n")...)
	}
	for _, m := range inlineCode.FindAllStringSubmatch(fence.ReplaceAllString(md, ""), -1) {
		lines = append(lines, m[1])
	}
	var out []string
	for _, l := range lines {
		for _, m := range harebox.FindAllStringSubmatch(strings.TrimSpace(l), -1) {
			inv := m[1]
			if loc := lineEnd.FindStringIndex(unquote(inv)); loc != nil {
				inv = inv[:loc[0]]
			}
			out = append(out, strings.TrimSpace(inv))
		}
	}
	return out
}

// unquote blanks quoted strings (a shell string's own --flags are not
// harebox's), keeping their length.
func unquote(s string) string {
	return quoted.ReplaceAllStringFunc(s, func(q string) string { return strings.Repeat("_", len(q)) })
}

func flagsOf(inv string) []string {
	var out []string
	for _, m := range flagName.FindAllStringSubmatch(unquote(inv), -1) {
		out = append(out, m[1])
	}
	return out
}

// takes says whether a --help text lists flag name ("  -name" on a line
// of its own, or followed by its value's type).
func takes(help, name string) bool {
	for _, l := range strings.Split(help, "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(l, "  -") && f[0] == "-"+name {
			return true
		}
	}
	return false
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
