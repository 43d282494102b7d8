// Package doccmds finds the command lines the README and docs/ show, so
// that the commands' tests can hold them against their own --help: a
// command or flag renamed or removed fails a test, not a reader's shell.
package doccmds

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Line is one command line of a page: its arguments after the program's
// name.
type Line struct {
	File string // the page's base name
	Args string
}

var (
	fence      = regexp.MustCompile("(?s)```[a-z]*\n(.*?)```")
	inlineCode = regexp.MustCompile("`([^`\n]+)`")
	// Where a command line ends: a pipe into another program, a
	// subshell's end, a list, a comment, the start of the guest's own
	// arguments.
	lineEnd  = regexp.MustCompile(`\|\s*[a-z]|\)|;|&&|\s#|\s--(\s|$)`)
	flagName = regexp.MustCompile(`(?:^|[\s\[|(])--([a-z][a-z0-9-]*)`)
	quoted   = regexp.MustCompile(`'[^']*'|"[^"]*"`)
)

// Find returns the command lines of prog in root's README.md and
// docs/*.md: in code blocks (a trailing \ joins the next line) and in
// inline code; prog at a line's start, after a shell's $( ; && | or a
// prompt's "$ ".
func Find(root, prog string) ([]Line, error) {
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"))
	start := regexp.MustCompile(`(?:^|\$\(|[;&|]\s*|\$ )` + regexp.QuoteMeta(prog) + `\s+([a-z$"-][^\n]*)`)
	var out []Line
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		md := string(b)
		var lines []string
		for _, m := range fence.FindAllStringSubmatch(md, -1) {
			lines = append(lines, strings.Split(strings.ReplaceAll(m[1], "\\\n", " "), "\n")...)
		}
		for _, m := range inlineCode.FindAllStringSubmatch(fence.ReplaceAllString(md, ""), -1) {
			lines = append(lines, m[1])
		}
		for _, l := range lines {
			for _, m := range start.FindAllStringSubmatch(strings.TrimSpace(l), -1) {
				args := m[1]
				if loc := lineEnd.FindStringIndex(unquote(args)); loc != nil {
					args = args[:loc[0]]
				}
				out = append(out, Line{File: filepath.Base(f), Args: strings.TrimSpace(args)})
			}
		}
	}
	return out, nil
}

// Fields are a line's words, quoted strings blanked (kept as one word).
func Fields(args string) []string { return strings.Fields(unquote(args)) }

// Flags are the --flags a line gives (not those inside quoted strings: a
// shell string's own are not the program's).
func Flags(args string) []string {
	var out []string
	for _, m := range flagName.FindAllStringSubmatch(unquote(args), -1) {
		out = append(out, m[1])
	}
	return out
}

// Takes says whether a Go flag set's --help text lists flag name ("  -name"
// alone, or followed by its value's type).
func Takes(help, name string) bool {
	for _, l := range strings.Split(help, "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(l, "  -") && f[0] == "-"+name {
			return true
		}
	}
	return false
}

// unquote blanks quoted strings, keeping their length.
func unquote(s string) string {
	return quoted.ReplaceAllStringFunc(s, func(q string) string { return strings.Repeat("_", len(q)) })
}
