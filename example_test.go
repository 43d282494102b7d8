package harebox_test

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/sandbox"
)

// Run untrusted code in a fresh VM and throw the VM away. (It needs a host
// with QEMU and built images, so it is compiled but not run by go test.)
func Example() {
	ctx := context.Background()
	eng, err := harebox.New(ctx, harebox.Options{DataDir: "/var/lib/harebox"})
	if err != nil {
		log.Fatal(err)
	}
	defer eng.Close()

	box, err := eng.Create(ctx, sandbox.CreateRequest{Name: "untrusted", NoEnv: true, TTLSeconds: 900})
	if err != nil {
		log.Fatal(err)
	}
	defer eng.Delete(ctx, box.ID)

	job := strings.NewReader("print(sum(range(10)))\n")
	if _, err := eng.WriteFile(ctx, box.ID, "/home/user/job.py", job, sandbox.WriteOptions{}); err != nil {
		log.Fatal(err)
	}
	res, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "python3 /home/user/job.py", TimeoutSeconds: 60})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
}
