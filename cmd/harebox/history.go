package main

// A sandbox's command history: harebox history. What is kept, and how
// long, is the account's retention (harebox account update); a sandbox
// created with --no-monitoring keeps none.

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/sandbox"
)

// maxHistory is the most entries one listCommands returns.
const maxHistory = 10000

func cmdHistory(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox history ID [--limit N]", flag.ContinueOnError)
	limit := fs.Int("limit", 0, fmt.Sprintf("only the newest N entries, 1 to %d (default all)", maxHistory))
	pos, err := exactly(fs, c, args, "ID")
	if err != nil {
		return 0, err
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "limit" })
	var q url.Values
	if given {
		if *limit < 1 || *limit > maxHistory {
			return 0, usageError{fmt.Sprintf("--limit %d: want 1 to %d", *limit, maxHistory)}
		}
		q = url.Values{"limit": {strconv.Itoa(*limit)}}
	}
	var out struct {
		Commands []sandbox.Command `json:"commands"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.SandboxPath(pos[0], "/commands"), q, nil, &out); err != nil {
		return 0, err
	}
	if out.Commands == nil {
		out.Commands = []sandbox.Command{}
	}
	var rows [][]string
	for _, cmd := range out.Commands {
		rows = append(rows, []string{cmd.ID, cmd.Kind, when(&cmd.StartedAt), exitOf(cmd.Result), commandLine(cmd)})
	}
	return 0, c.show(out, "ID\tKIND\tSTARTED\tEXIT\tCMD", rows)
}

// exitOf is how a command ended, for a table.
func exitOf(r *sandbox.ExecResult) string {
	switch {
	case r == nil:
		return "-"
	case r.Error != "":
		return "error"
	case r.TimedOut:
		return "timeout"
	case r.Signal != 0:
		return "signal " + strconv.Itoa(r.Signal)
	}
	return strconv.Itoa(r.ExitCode)
}

// maxCommandLine bounds a command in a table row.
const maxCommandLine = 120

// commandLine is a command on one line of a table: the shell string, or
// the argv with the arguments that need it single-quoted, as for a shell.
func commandLine(c sandbox.Command) string {
	s := c.Cmd
	if s == "" {
		var parts []string
		for _, a := range c.Argv {
			if a == "" || strings.ContainsAny(a, " \t\n\"'\\$`;&|<>()*?[]{}#~") {
				a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
			}
			parts = append(parts, a)
		}
		s = strings.Join(parts, " ")
	}
	s = oneLine(s)
	if r := []rune(s); len(r) > maxCommandLine {
		s = string(r[:maxCommandLine-1]) + "…"
	}
	return dash(s)
}
