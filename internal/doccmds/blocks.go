package doccmds

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Block is one fenced code block of a page.
type Block struct {
	File string // the page, relative to the root: README.md, docs/keys.md
	Line int    // its opening fence's line
	Lang string // the fence's info string: sh, python, ts, js, go, json, yaml, text
	Code string
	// NotRun says why an example is not run, from the line before its
	// fence: <!-- not run: REASON -->.
	NotRun string
}

// Where names the block for a message: docs/keys.md:12.
func (b Block) Where() string { return fmt.Sprintf("%s:%d", b.File, b.Line) }

var notRun = regexp.MustCompile(`^<!-- not run: (.+) -->$`)

// Blocks returns the fenced code blocks of root's README.md and
// docs/*.md, in page order (the README first).
func Blocks(root string) ([]Block, error) {
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	var out []Block
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		bs, err := pageBlocks(f, rel)
		if err != nil {
			return nil, err
		}
		out = append(out, bs...)
	}
	return out, nil
}

func pageBlocks(path, rel string) ([]Block, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		out  []Block
		cur  *Block
		prev string // the last line before a block that is not blank
		code strings.Builder
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &Block{File: rel, Line: n, Lang: strings.TrimSpace(strings.TrimPrefix(line, "```"))}
			if m := notRun.FindStringSubmatch(prev); m != nil {
				cur.NotRun = strings.TrimSpace(m[1])
			}
			code.Reset()
		case cur != nil && strings.TrimSpace(line) == "```":
			cur.Code = code.String()
			out = append(out, *cur)
			cur, prev = nil, ""
		case cur != nil:
			code.WriteString(line + "\n")
		case strings.TrimSpace(line) != "":
			prev = strings.TrimSpace(line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("%s: the block at line %d has no end", rel, cur.Line)
	}
	return out, nil
}
