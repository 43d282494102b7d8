package sandboxrt

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOnlyTheRootImportsTheRuntime: internal/ lets the whole module
// import the runtime, but only harebox.New composes it; anything else
// would reach sandboxes past the Engine's calls.
func TestOnlyTheRootImportsTheRuntime(t *testing.T) {
	const self = "github.com/harebox/harebox/internal/sandboxrt"
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	seen := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if path, _ := strconv.Unquote(imp.Path.Value); path == self {
				seen++
				if filepath.Dir(p) != root {
					t.Errorf("%s imports the runtime: only package harebox (the root) may", p)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen == 0 {
		t.Fatal("no file imports the runtime: the walk missed the root")
	}
}
