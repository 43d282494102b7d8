// Command meshprobe is what the mesh's tests run in a guest:
//
//	meshprobe serve              echo TCP and UDP on port 7007, every address
//	meshprobe echo tcp|udp HOST [WAIT]
//	                             send a line to HOST:7007 (a name is
//	                             resolved by the guest's resolver) and wait
//	                             for it back, WAIT at most (a Go duration,
//	                             default 3s); exit 1 if it does not come
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "serve" {
		serve()
		return
	}
	wait := 3 * time.Second
	if len(os.Args) == 5 {
		var err error
		if wait, err = time.ParseDuration(os.Args[4]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if len(os.Args) < 4 || len(os.Args) > 5 || os.Args[1] != "echo" || (os.Args[2] != "tcp" && os.Args[2] != "udp") {
		fmt.Fprintln(os.Stderr, "usage: meshprobe serve | meshprobe echo tcp|udp HOST [WAIT]")
		os.Exit(2)
	}
	if err := echo(os.Args[2], os.Args[3], wait); err != nil {
		fmt.Println("fail:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
}

const line = "mesh canary\n"

func echo(proto, host string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	c, err := net.DialTimeout(proto, net.JoinHostPort(host, "7007"), wait)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(deadline)
	if _, err := io.WriteString(c, line); err != nil {
		return err
	}
	buf := make([]byte, len(line))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != line {
		return fmt.Errorf("got %q back", buf)
	}
	return nil
}

func serve() {
	ln, err := net.Listen("tcp", ":7007")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pc, err := net.ListenPacket("udp", ":7007")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() { defer c.Close(); io.Copy(c, c) }()
	}
}
