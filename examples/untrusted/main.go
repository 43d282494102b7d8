// Command untrusted is the untrusted-code walkthrough as a Go program that
// uses only the library: create a sandbox with no environment and a TTL,
// write a job into it, run it under a timeout, print the result, delete
// the sandbox.
//
//	go run ./examples/untrusted --data-dir /var/lib/harebox
//
// The engine finds harebox-plugin-qemu beside the executable or on PATH,
// and the default image in DATA_DIR/images (make image-default builds it;
// --image-dir points elsewhere).
package main

import (
	"bytes"
	"context"
	_ "embed"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/sandbox"
)

//go:embed job.py
var job []byte

func main() {
	dataDir := flag.String("data-dir", "/var/lib/harebox", "engine data directory")
	imageDir := flag.String("image-dir", "", "where built images are (default DATA_DIR/images)")
	pluginPath := flag.String("plugin", "", "the QEMU plugin binary (default: beside this program, or on PATH)")
	image := flag.String("image", "default", "image to boot")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	eng, err := harebox.New(ctx, harebox.Options{DataDir: *dataDir, ImageDir: *imageDir, PluginPath: *pluginPath})
	if err != nil {
		log.Fatal(err)
	}
	defer eng.Close()

	box, err := eng.Create(ctx, sandbox.CreateRequest{
		Name: "untrusted", Size: sandbox.Size{Preset: "small"}, Image: *image, NoEnv: true, TTLSeconds: 900,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer eng.Delete(context.WithoutCancel(ctx), box.ID)
	fmt.Printf("sandbox %s is %s at %s\n", box.ID, box.State, box.Site.Name)

	if _, err := eng.WriteFile(ctx, box.ID, "/home/user/job.py", bytes.NewReader(job), sandbox.WriteOptions{}); err != nil {
		log.Fatal(err)
	}
	res, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "python3 /home/user/job.py", TimeoutSeconds: 300})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.ExitCode, res.Stdout)
	if res.ExitCode != 0 {
		fmt.Fprint(os.Stderr, res.Stderr)
	}
}
