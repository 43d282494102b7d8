// Command harebox-agent is the HareBox guest agent: PID 1 of the initramfs
// (mounts, modules, switch_root or staying init) and the in-guest gRPC
// service ("serve") on virtio-serial and vsock.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/agent/guest"
	"github.com/harebox/harebox/agent/initproc"
	"github.com/harebox/harebox/agent/layout"
)

const usage = `usage: harebox-agent [init | serve [flags] | version]

  init     PID-1 duties (the default when running as PID 1)
  serve    serve the agent on virtio-serial and vsock
  version  print the version
`

func main() {
	log.SetFlags(0)
	log.SetPrefix("harebox-agent: ")
	os.Exit(run(context.Background(), os.Getpid(), os.Args[1:], os.Stdout, os.Stderr))
}

// command picks the subcommand. As PID 1 it is always init: the kernel
// passes unknown command-line words as init's arguments.
func command(pid int, args []string) (string, []string) {
	if pid == 1 {
		return "init", nil
	}
	if len(args) == 0 {
		return "", nil
	}
	return args[0], args[1:]
}

func run(ctx context.Context, pid int, args []string, stdout, stderr io.Writer) int {
	cmd, rest := command(pid, args)
	switch cmd {
	case "init":
		if pid != 1 {
			// Its mounts would shadow the host's /tmp and /run.
			fmt.Fprintln(stderr, "harebox-agent: init must run as PID 1 (the initramfs /init)")
			return 2
		}
		err := initproc.Run(initproc.Options{Logf: log.Printf})
		// PID 1 must not exit: the kernel would panic. Keep reaping.
		log.Printf("init: %v", err)
		for {
			var ws syscall.WaitStatus
			if _, err := syscall.Wait4(-1, &ws, 0, nil); err != nil {
				select {}
			}
		}
	case "serve":
		return serve(ctx, rest, stderr)
	case "version":
		fmt.Fprintln(stdout, guest.Version)
		return 0
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
}

func serve(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "", "serve on this Unix socket instead (development and tests)")
	serial := fs.String("serial", layout.SerialName, "virtio-serial port name; empty disables it")
	useVsock := fs.Bool("vsock", true, fmt.Sprintf("also listen on vsock port %d", layout.VsockPort))
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv := guest.New(guest.Options{})
	log.Printf("serving (version %s)", guest.Version)

	if *socket != "" {
		os.Remove(*socket)
		l, err := net.Listen("unix", *socket)
		if err != nil {
			log.Print(err)
			return 1
		}
		guest.ServeListener(ctx, l, srv, log.Printf)
		return 0
	}
	lockMemory()
	if *useVsock {
		go serveVsock(ctx, srv)
	}
	if *serial != "" {
		guest.ServeSerial(ctx, srv, guest.ServeOptions{SerialName: *serial, Logf: log.Printf})
	}
	<-ctx.Done()
	return 0
}

// lockMemory keeps the agent's mapped pages in RAM as they are touched. A
// guest short of memory reclaims file-backed pages first, the agent's code
// among them, long before its OOM killer acts: the agent would then stall
// for seconds on page faults, miss keepalives and lose its session while
// the job that ate the memory is still being killed. (ONFAULT: locked when
// touched, nothing faulted in up front. Not FUTURE: the Go heap could then
// never give memory back. Children do not inherit it.)
func lockMemory() {
	if err := unix.Mlockall(unix.MCL_CURRENT | unix.MCL_ONFAULT); err != nil {
		log.Printf("cannot lock the agent's memory (%v); it may stall when the guest runs short", err)
	}
}

// serveVsock serves on vsock where the VM has it (Cloud Hypervisor); QEMU
// machines here use virtio-serial only, so its absence is not an error.
func serveVsock(ctx context.Context, srv *guest.Server) {
	l, err := vsock.Listen(layout.VsockPort, nil)
	if err != nil {
		log.Printf("vsock unavailable (%v); serving on virtio-serial only", err)
		return
	}
	log.Printf("listening on vsock port %d", layout.VsockPort)
	guest.ServeListener(ctx, l, srv, log.Printf)
}
