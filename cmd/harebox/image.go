package main

import (
	"context"
	"flag"
	"time"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/sandbox"
)

var cmdImage = group("image", []subcommand{
	{"list", "", "list the images sandboxes can be created from", imageList},
	{"build", "NAME --from registry:REF", "build an image from an OCI image in a registry (the operator only; minutes for a large image)", imageBuild},
	{"delete", "NAME", "remove every build of an image (refused while a sandbox or snapshot uses it)", imageDelete},
})

const imageHeader = "NAME\tFROM\tDIGEST\tKERNEL\tBUILT"

func imageRow(i sandbox.Image) []string {
	return []string{i.Name, dash(i.From), dash(i.Digest), i.KernelVersion, i.BuiltAt.Format(time.RFC3339)}
}

func imageList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	var out struct {
		Images []sandbox.Image `json:"images"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.Path("images"), nil, nil, &out); err != nil {
		return 0, err
	}
	var rows [][]string
	for _, i := range out.Images {
		rows = append(rows, imageRow(i))
	}
	return 0, c.show(out, imageHeader, rows)
}

func imageBuild(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	from := fs.String("from", "", "the OCI image: registry:REF (e.g. registry:ghcr.io/org/app:1)")
	pos, err := exactly(fs, c, args, "NAME")
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	var i sandbox.Image
	if err := c.c.Do(ctx, "POST", apiclient.Path("images"), nil, sandbox.ImageBuildRequest{Name: pos[0], From: *from}, &i); err != nil {
		return 0, err
	}
	return 0, c.show(i, imageHeader, [][]string{imageRow(i)})
}

func imageDelete(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	pos, err := exactly(fs, c, args, "NAME")
	if err != nil {
		return 0, err
	}
	return 0, c.c.Do(ctx, "DELETE", apiclient.Path("images", pos[0]), nil, nil, nil)
}
