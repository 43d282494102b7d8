package main

import (
	"context"
	"flag"
	"net/url"
	"strconv"
	"time"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/sandbox"
)

var cmdSnapshot = group("snapshot", []subcommand{
	{"create", "ID [--name NAME]", "snapshot a running or paused sandbox (paused only while it is written); it outlives the sandbox", snapshotCreate},
	{"list", "[--sandbox ID]", "list the snapshots", snapshotList},
	{"get", "SNAPSHOT_ID", "show a snapshot", snapshotCmd("GET")},
	{"delete", "SNAPSHOT_ID", "erase a snapshot's key and remove its files (its clones keep running)", snapshotCmd("DELETE")},
})

const snapshotHeader = "ID\tNAME\tSANDBOX\tIMAGE\tBYTES\tCREATED"

func snapshotRow(s sandbox.Snapshot) []string {
	return []string{s.ID, dash(s.Name), s.SandboxID, s.Image, strconv.FormatInt(s.Bytes, 10), s.CreatedAt.Format(time.RFC3339)}
}

func snapshotCreate(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	name := fs.String("name", "", "a name for the snapshot, unique in the account")
	pos, err := exactly(fs, c, args, "ID")
	if err != nil {
		return 0, err
	}
	var s sandbox.Snapshot
	if err := c.c.Do(ctx, "POST", apiclient.Path("sandboxes", pos[0], "snapshots"), nil, sandbox.SnapshotRequest{Name: *name}, &s); err != nil {
		return 0, err
	}
	return 0, c.show(s, snapshotHeader, [][]string{snapshotRow(s)})
}

func snapshotList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	sb := fs.String("sandbox", "", "only this sandbox's snapshots")
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	var q url.Values
	if *sb != "" {
		q = url.Values{"sandbox": {*sb}}
	}
	var out struct {
		Snapshots []sandbox.Snapshot `json:"snapshots"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.Path("snapshots"), q, nil, &out); err != nil {
		return 0, err
	}
	var rows [][]string
	for _, s := range out.Snapshots {
		rows = append(rows, snapshotRow(s))
	}
	return 0, c.show(out, snapshotHeader, rows)
}

func snapshotCmd(method string) func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	return func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
		pos, err := exactly(fs, c, args, "SNAPSHOT_ID")
		if err != nil {
			return 0, err
		}
		if method == "DELETE" {
			return 0, c.c.Do(ctx, method, apiclient.Path("snapshots", pos[0]), nil, nil, nil)
		}
		var s sandbox.Snapshot
		if err := c.c.Do(ctx, method, apiclient.Path("snapshots", pos[0]), nil, nil, &s); err != nil {
			return 0, err
		}
		return 0, c.show(s, snapshotHeader, [][]string{snapshotRow(s)})
	}
}

// cmdFork makes clones of a running or paused sandbox.
func cmdFork(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox fork", flag.ContinueOnError)
	count := fs.Int("count", 1, "how many clones (at most 16)")
	name := fs.String("name", "", "name the clones NAME-1 ... NAME-COUNT")
	ttl := fs.Int64("ttl", 0, "delete each clone this many seconds after it is made")
	labels := kv{}
	fs.Var(labels, "label", "a label KEY=VALUE added to the source's (repeatable)")
	var vols volumeMounts
	fs.Var(&vols, "volume", "NAME:/PATH[:ro]: a volume each clone attaches, in place of the source's (repeatable); without it, the source's")
	noVols := fs.Bool("no-volumes", false, "the clones attach no volume")
	pos, err := parse(fs, c, args, 1)
	if err != nil {
		return 0, err
	}
	if *noVols && len(vols) > 0 {
		return 0, usageError{"--no-volumes and --volume: give one"}
	}
	req := sandbox.ForkRequest{Count: *count, Name: *name, TTLSeconds: *ttl, Volumes: vols}
	if len(labels) > 0 {
		req.Labels = labels
	}
	var body any = req
	if *noVols {
		// (An empty list, which the request's JSON would leave out.)
		body = struct {
			sandbox.ForkRequest
			Volumes []sandbox.VolumeMount `json:"volumes"`
		}{req, []sandbox.VolumeMount{}}
	}
	var out struct {
		Sandboxes []sandbox.Sandbox `json:"sandboxes"`
	}
	if err := c.c.Do(ctx, "POST", apiclient.Path("sandboxes", pos[0], "fork"), nil, body, &out); err != nil {
		return 0, err
	}
	return 0, c.printSandboxes(out.Sandboxes...)
}
