package main

import (
	"context"
	"flag"
	"io"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/harebox/harebox/mcpserver"
)

// cmdMCP serves the Model Context Protocol on stdin and stdout for an
// agent framework that starts it, until the framework closes stdin. Each
// tool calls the server with this CLI's key.
func cmdMCP(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox mcp", flag.ContinueOnError)
	if _, err := parse(fs, c, args, 0); err != nil {
		return 0, err
	}
	t := &mcp.IOTransport{Reader: io.NopCloser(c.stdin), Writer: nopWriteCloser{c.stdout}}
	if err := mcpserver.New(c.c, version).Run(ctx, t); err != nil && ctx.Err() == nil {
		return 0, err
	}
	return 0, nil
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
