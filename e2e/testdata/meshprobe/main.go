// Command meshprobe is what the mesh's tests run in a guest:
//
//	meshprobe serve              echo TCP and UDP on port 7007, and a TCP
//	                             sink on 7008, on every address
//	meshprobe echo tcp|udp HOST [WAIT]
//	                             send a line to HOST:7007 (a name is
//	                             resolved by the guest's resolver) and wait
//	                             for it back, WAIT at most (a Go duration,
//	                             default 3s); exit 1 if it does not come
//	meshprobe bench HOST MIB     over TCP to HOST: the p50 of 200 one-byte
//	                             round trips (port 7007) and MIB MiB
//	                             sent to a sink (port 7008), printed as
//	                             JSON {"rtt_p50_us", "mib_per_s"}
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "serve" {
		serve()
		return
	}
	if len(os.Args) == 4 && os.Args[1] == "bench" {
		mb, err := strconv.Atoi(os.Args[3])
		if err == nil {
			err = bench(os.Args[2], mb)
		}
		if err != nil {
			fmt.Println("fail:", err)
			os.Exit(1)
		}
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

// bench measures round trips and throughput to host's serve.
func bench(host string, mb int) error {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(host, "7007"), 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	var rtts []time.Duration
	b := make([]byte, 1)
	for range 200 {
		start := time.Now()
		if _, err := c.Write(b); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			return err
		}
		rtts = append(rtts, time.Since(start))
	}
	slices.Sort(rtts)
	sink, err := net.DialTimeout("tcp", net.JoinHostPort(host, "7008"), 3*time.Second)
	if err != nil {
		return err
	}
	defer sink.Close()
	chunk := make([]byte, 256<<10)
	start := time.Now()
	for range mb * 4 {
		if _, err := sink.Write(chunk); err != nil {
			return err
		}
	}
	sink.(*net.TCPConn).CloseWrite()
	// (The sink answers once it has read everything.)
	if _, err := io.ReadFull(sink, b); err != nil {
		return err
	}
	secs := time.Since(start).Seconds()
	return json.NewEncoder(os.Stdout).Encode(map[string]float64{
		"rtt_p50_us": float64(rtts[len(rtts)/2].Microseconds()), "mib_per_s": float64(mb) / secs,
	})
}

func serve() {
	ln, err := net.Listen("tcp", ":7007")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sink, err := net.Listen("tcp", ":7008")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(io.Discard, c); c.Write([]byte{1}) }()
		}
	}()
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
