package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/sandbox"
)

func cmdPs(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox ps", flag.ContinueOnError)
	pos, err := parse(fs, c, args, 1)
	if err != nil {
		return 0, err
	}
	var out struct {
		Processes []sandbox.Process `json:"processes"`
	}
	if err := c.c.Do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(pos[0])+"/processes", nil, nil, &out); err != nil {
		return 0, err
	}
	if c.output == "json" {
		return 0, c.json(out)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPID\tSTATE\tSTARTED\tCOMMAND")
	for _, p := range out.Processes {
		state := "running"
		if p.Result != nil {
			state = fmt.Sprintf("exited %d", p.Result.ExitCode)
			if p.Result.Signal != 0 {
				state = fmt.Sprintf("killed %d", p.Result.Signal)
			}
		}
		cmd := p.Cmd
		if cmd == "" && len(p.Argv) > 0 {
			cmd = fmt.Sprint(p.Argv)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", p.ID, p.PID, state, p.StartedAt.Local().Format(time.DateTime), cmd)
	}
	return 0, tw.Flush()
}

// attachRetries bounds the reconnections of a followed output whose
// stream broke (a network drop, a server restart).
const attachRetries = 30

func cmdAttach(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox attach", flag.ContinueOnError)
	noFollow := fs.Bool("no-follow", false, "print what is kept and return, without waiting for the rest")
	outOff := fs.Uint64("stdout-offset", 0, "bytes of stdout already seen")
	errOff := fs.Uint64("stderr-offset", 0, "bytes of stderr already seen")
	pos, err := parse(fs, c, args, 2)
	if err != nil {
		return 0, err
	}
	offsets := [2]uint64{*outOff, *errOff}
	for try := 0; ; try++ {
		var res *sandbox.ExecResult
		res, offsets, err = c.c.ProcessOutput(ctx, pos[0], pos[1], offsets, !*noFollow, c.stdout, c.stderr)
		var ae *apiclient.Error
		switch {
		case res != nil:
			return c.exitCode("attach", res), nil
		case errors.As(err, &ae) && (ae.Status != 503 || try >= attachRetries):
			// (A 503, the sandbox's agent not reachable yet after a
			// server restart, is tried again: reading output is safe to
			// repeat.)
			return 0, err
		case err == nil && *noFollow:
			return 0, nil // still running
		case try >= attachRetries || ctx.Err() != nil:
			if err == nil {
				err = errors.New("the output stream ended before the process")
			}
			return 0, err
		}
		// A broken stream: go on from where it broke.
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func cmdKill(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox kill", flag.ContinueOnError)
	sig := fs.Int("signal", 9, "the signal number")
	pos, err := parse(fs, c, args, 2)
	if err != nil {
		return 0, err
	}
	body := map[string]int{"signal": *sig}
	return 0, c.c.Do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(pos[0])+"/processes/"+url.PathEscape(pos[1])+"/kill", nil, body, nil)
}
