package main

// harebox volume: a project's volumes, disks that outlive sandboxes,
// encrypted under their own keys (harebox new --volume NAME:PATH[:ro]).

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
)

var cmdVolume = group("volume", []subcommand{
	{"create", "NAME --size GB [--project REF] [--account REF]", "create a volume, encrypted under its own key, on the server's host", volumeCreate},
	{"list", "[--project REF] [--account REF]", "list a project's volumes", volumeList},
	{"get", "NAME [--project REF] [--account REF]", "show a volume (name or ID) and the sandboxes it is attached to", volumeGet},
	{"resize", "NAME --size GB [--project REF] [--account REF]", "grow a volume no sandbox has attached", volumeResize},
	{"delete", "NAME [--project REF] [--account REF]", "delete a volume no sandbox has attached: its key is erased, then its file", volumeDelete},
})

// volumeView is a volume as the API shows it.
type volumeView struct {
	model.Volume
	Project string `json:"project"`
}

func volumeCreate(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	size := fs.Int("size", 0, "its size in GB (at least 1)")
	pos, err := exactly(fs, c, args, "NAME")
	if err != nil {
		return 0, err
	}
	if *size < 1 {
		return 0, usageError{"--size: give the volume's size in GB (at least 1)"}
	}
	var v volumeView
	if err := c.c.Do(ctx, "POST", apiclient.Path("volumes"), query(), map[string]any{"name": pos[0], "size_gb": *size}, &v); err != nil {
		return 0, err
	}
	return 0, c.printVolume(v)
}

func volumeList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	var out struct {
		Volumes []volumeView `json:"volumes"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.Path("volumes"), query(), nil, &out); err != nil {
		return 0, err
	}
	var rows [][]string
	for _, v := range out.Volumes {
		rows = append(rows, []string{v.Name, strconv.Itoa(v.SizeGB), strconv.FormatInt(v.UsedBytes>>20, 10), attached(v.Attachments), v.Project, v.Host})
	}
	return 0, c.show(out, "NAME\tSIZE-GB\tUSED-MB\tATTACHED\tPROJECT\tHOST", rows)
}

func volumeGet(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	pos, err := exactly(fs, c, args, "NAME")
	if err != nil {
		return 0, err
	}
	var v volumeView
	if err := c.c.Do(ctx, "GET", apiclient.Path("volumes", pos[0]), query(), nil, &v); err != nil {
		return 0, err
	}
	return 0, c.printVolume(v)
}

func volumeResize(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	size := fs.Int("size", 0, "its new size in GB (a volume only grows)")
	pos, err := exactly(fs, c, args, "NAME")
	if err != nil {
		return 0, err
	}
	if *size < 1 {
		return 0, usageError{"--size: give the volume's new size in GB"}
	}
	var v volumeView
	if err := c.c.Do(ctx, "PATCH", apiclient.Path("volumes", pos[0]), query(), map[string]any{"size_gb": *size}, &v); err != nil {
		return 0, err
	}
	return 0, c.printVolume(v)
}

func volumeDelete(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	pos, err := exactly(fs, c, args, "NAME")
	if err != nil {
		return 0, err
	}
	if err := c.c.Do(ctx, "DELETE", apiclient.Path("volumes", pos[0]), query(), nil, nil); err != nil {
		return 0, err
	}
	return 0, c.deleted("volume", pos[0])
}

func (c *cli) printVolume(v volumeView) error {
	if c.output == "json" {
		return c.json(v)
	}
	return c.table("ID\tNAME\tSIZE-GB\tUSED-MB\tATTACHED\tPROJECT\tHOST", [][]string{{
		v.ID, v.Name, strconv.Itoa(v.SizeGB), strconv.FormatInt(v.UsedBytes>>20, 10), attached(v.Attachments), v.Project, v.Host}})
}

// attached lists the sandboxes a volume is attached to, "-" for none.
func attached(as []model.VolumeAttachment) string {
	if len(as) == 0 {
		return "-"
	}
	var out []string
	for _, a := range as {
		s := a.SandboxID + ":" + a.Path
		if a.ReadOnly {
			s += ":ro"
		}
		out = append(out, s)
	}
	return strings.Join(out, ",")
}

// volumeMounts collects harebox new's --volume NAME:PATH[:ro].
type volumeMounts []sandbox.VolumeMount

func (v *volumeMounts) String() string { return "" }
func (v *volumeMounts) Set(s string) error {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || !strings.HasPrefix(parts[1], "/") || (len(parts) == 3 && parts[2] != "ro" && parts[2] != "rw") {
		return fmt.Errorf("want NAME:/PATH or NAME:/PATH:ro")
	}
	*v = append(*v, sandbox.VolumeMount{Name: parts[0], Path: parts[1], ReadOnly: len(parts) == 3 && parts[2] == "ro"})
	return nil
}
