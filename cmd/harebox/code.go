package main

import (
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/harebox/harebox/sandbox"
)

// Exit codes of run-code besides 0: the cell raised (1), timed out
// (124), or its kernel died (125).
const (
	exitCodeError = 1
	exitCodeTimed = 124
	exitCodeDied  = 125
)

func cmdRunCode(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox run-code", flag.ContinueOnError)
	var req sandbox.CodeRequest
	fs.StringVar(&req.ContextID, "context", "", "the context it runs in (default: the language's default context)")
	fs.StringVar(&req.Language, "language", "", "python (default), javascript, typescript or bash")
	code := fs.String("c", "", "the code (else --file, else stdin)")
	file := fs.String("file", "", "a file of code to run")
	fs.Float64Var(&req.TimeoutSeconds, "timeout", 0, "seconds before the cell is interrupted (default 300)")
	env := kv{}
	fs.Var(env, "env", "environment variable KEY=VALUE for this cell (repeatable)")
	save := fs.String("save-results", "", "write each rich result (charts, HTML, ...) to this directory as result-N.png, .jpeg, .svg, .html, .md, .json")
	pos, err := parse(fs, c, args, 1)
	if err != nil {
		return 0, err
	}
	switch {
	case *code != "" && *file != "":
		return 0, usageError{"give -c or --file, not both"}
	case *code != "":
		req.Code = *code
	case *file != "":
		b, err := os.ReadFile(*file)
		if err != nil {
			return 0, err
		}
		req.Code = string(b)
	default:
		b, err := io.ReadAll(io.LimitReader(c.stdin, sandbox.MaxCodeBytes+1))
		if err != nil {
			return 0, err
		}
		req.Code = string(b)
	}
	if len(env) > 0 {
		req.Env = env
	}
	if *save != "" {
		if err := os.MkdirAll(*save, 0o755); err != nil {
			return 0, err
		}
	}
	var x *sandbox.CodeExecution
	var results []sandbox.CodeResult
	if c.output == "json" && *save == "" {
		if x, err = c.c.RunCode(ctx, pos[0], req); err != nil {
			return 0, err
		}
		results = x.Results
		if err := c.json(x); err != nil {
			return 0, err
		}
	} else {
		x, err = c.c.RunCodeStream(ctx, pos[0], req, func(ev sandbox.CodeEvent) error {
			switch ev.Type {
			case "stdout":
				_, err := io.WriteString(c.stdout, ev.Text)
				return err
			case "stderr":
				_, err := io.WriteString(c.stderr, ev.Text)
				return err
			case "result":
				results = append(results, *ev.Result)
				if c.output != "json" && ev.Result.Text != "" && ev.Result.IsMainResult {
					fmt.Fprintln(c.stdout, ev.Result.Text)
				}
			case "error":
				if c.output != "json" {
					fmt.Fprintln(c.stderr, cellError(ev.Error))
				}
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
		if c.output == "json" {
			x.Results = results
			if err := c.json(x); err != nil {
				return 0, err
			}
		}
	}
	if *save != "" {
		for i, r := range results {
			if err := saveResult(*save, i+1, r); err != nil {
				return 0, err
			}
		}
	}
	switch x.Status {
	case sandbox.CodeFailed:
		return exitCodeError, nil
	case sandbox.CodeTimeout:
		return exitCodeTimed, nil
	case sandbox.CodeDied:
		fmt.Fprintf(c.stderr, "harebox run-code: the kernel died; harebox code-context restart %s %s brings it back\n", pos[0], x.ContextID)
		return exitCodeDied, nil
	}
	return 0, nil
}

// cellError is an exception as a terminal shows it: its traceback, else
// its name and value.
func cellError(e *sandbox.CodeError) string {
	if e.Traceback != "" {
		return strings.TrimRight(e.Traceback, "\n")
	}
	return e.Name + ": " + e.Value
}

// saveResult writes result n's formats to dir, one file each.
func saveResult(dir string, n int, r sandbox.CodeResult) error {
	write := func(ext string, b []byte) error {
		return os.WriteFile(filepath.Join(dir, fmt.Sprintf("result-%d.%s", n, ext)), b, 0o644)
	}
	for ext, b64 := range map[string]string{"png": r.PNG, "jpeg": r.JPEG} {
		if b64 == "" {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return fmt.Errorf("result %d: %s: %w", n, ext, err)
		}
		if err := write(ext, b); err != nil {
			return err
		}
	}
	for ext, s := range map[string]string{"svg": r.SVG, "html": r.HTML, "md": r.Markdown, "tex": r.LaTeX, "json": string(r.JSON)} {
		if s != "" {
			if err := write(ext, []byte(s)); err != nil {
				return err
			}
		}
	}
	return nil
}

var cmdCodeContext = group("code-context", []subcommand{
	{"create", "ID [--language python|javascript|typescript|bash] [--cwd DIR] [--env K=V]", "start a context: a kernel of its own, sharing only the filesystem with the others", codeContextCreate},
	{"list", "ID", "list the sandbox's contexts", codeContextList},
	{"restart", "ID CONTEXT", "give a context a fresh kernel (its state is lost; a dead kernel comes back)", codeContextRestart},
	{"delete", "ID CONTEXT", "shut a context's kernel down", codeContextDelete},
})

func codeContextCreate(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	var req sandbox.CodeContextRequest
	fs.StringVar(&req.Language, "language", "", "python (default), javascript, typescript or bash")
	fs.StringVar(&req.Cwd, "cwd", "", "where its code runs (default the user's home)")
	env := kv{}
	fs.Var(env, "env", "environment variable KEY=VALUE (repeatable)")
	pos, err := exactly(fs, c, args, "ID")
	if err != nil {
		return 0, err
	}
	if len(env) > 0 {
		req.Env = env
	}
	cc, err := c.c.CreateCodeContext(ctx, pos[0], req)
	if err != nil {
		return 0, err
	}
	return 0, c.json(cc)
}

func codeContextList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	pos, err := exactly(fs, c, args, "ID")
	if err != nil {
		return 0, err
	}
	l, err := c.c.CodeContexts(ctx, pos[0])
	if err != nil {
		return 0, err
	}
	if c.output == "json" {
		return 0, c.json(map[string]any{"contexts": l})
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tLANGUAGE\tCWD")
	for _, cc := range l {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", cc.ID, cc.Language, cc.Cwd)
	}
	return 0, tw.Flush()
}

func codeContextRestart(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	pos, err := exactly(fs, c, args, "ID", "CONTEXT")
	if err != nil {
		return 0, err
	}
	cc, err := c.c.RestartCodeContext(ctx, pos[0], pos[1])
	if err != nil {
		return 0, err
	}
	return 0, c.json(cc)
}

func codeContextDelete(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	pos, err := exactly(fs, c, args, "ID", "CONTEXT")
	if err != nil {
		return 0, err
	}
	return 0, c.c.DeleteCodeContext(ctx, pos[0], pos[1])
}
