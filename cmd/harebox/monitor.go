package main

// Monitoring: harebox metrics ID (a sandbox's samples) and harebox metrics
// --server (the server's Prometheus text).

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/harebox/harebox/apiclient"
)

func cmdMetrics(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox metrics", flag.ContinueOnError)
	from := fs.String("from", "", "only samples at or after this RFC 3339 time")
	to := fs.String("to", "", "only samples before this RFC 3339 time")
	limit := fs.Int("limit", 1000, "at most this many samples, 1 to 10000")
	fs.Bool("server", false, "print the server's metrics (Prometheus text format) instead of a sandbox's")
	if slices.Contains(args, "--server") || slices.Contains(args, "-server") {
		if _, err := exactly(fs, c, args); err != nil {
			return 0, err
		}
		return 0, c.c.Do(ctx, "GET", "/metrics", nil, nil, c.stdout)
	}
	pos, err := exactly(fs, c, args, "ID")
	if err != nil {
		return 0, err
	}
	q := url.Values{"limit": {strconv.Itoa(*limit)}}
	for name, v := range map[string]string{"from": *from, "to": *to} {
		if v == "" {
			continue
		}
		if _, err := time.Parse(time.RFC3339, v); err != nil {
			return 0, usageError{fmt.Sprintf("--%s %q: want an RFC 3339 time, e.g. 2026-11-30T12:00:00Z", name, v)}
		}
		q.Set(name, v)
	}
	var out struct {
		Samples []struct {
			Time             time.Time `json:"time"`
			CPUSeconds       float64   `json:"cpu_seconds"`
			MemoryBytes      int64     `json:"memory_bytes"`
			DiskBytes        int64     `json:"disk_bytes"`
			NetSentBytes     uint64    `json:"net_sent_bytes"`
			NetReceivedBytes uint64    `json:"net_received_bytes"`
		} `json:"samples"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.SandboxPath(pos[0], "/metrics"), q, nil, &out); err != nil {
		return 0, err
	}
	var rows [][]string
	for _, s := range out.Samples {
		rows = append(rows, []string{s.Time.Format(time.RFC3339), fmt.Sprintf("%.2f", s.CPUSeconds), fmt.Sprint(s.MemoryBytes >> 20),
			fmt.Sprint(s.DiskBytes >> 20), fmt.Sprint(s.NetSentBytes), fmt.Sprint(s.NetReceivedBytes)})
	}
	return 0, c.show(out, "TIME\tCPU_S\tMEMORY_MIB\tDISK_MIB\tNET_SENT\tNET_RECEIVED", rows)
}
