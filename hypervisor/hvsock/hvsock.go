package client

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"time"
)

// DialHybridVsock connects to a guest vsock port through a Cloud
// Hypervisor/Firecracker hybrid-vsock Unix socket: "CONNECT <port>\n" in one
// write, then one "OK <host port>\n" line back. The reply is bounded and
// timed out; bytes after it stay readable on the returned conn.
func DialHybridVsock(ctx context.Context, path string, port uint32) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	dl := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err := conn.Write([]byte("CONNECT " + strconv.FormatUint(uint64(port), 10) + "\n")); err != nil {
		conn.Close()
		return nil, fmt.Errorf("hybrid vsock: send CONNECT: %w", err)
	}
	// Read byte by byte up to the newline so nothing after it is consumed.
	var line []byte
	b := make([]byte, 1)
	for len(line) < 32 {
		if _, err := conn.Read(b); err != nil {
			conn.Close()
			return nil, fmt.Errorf("hybrid vsock: port %d: no OK reply: %w", port, err)
		}
		if b[0] == '\n' {
			break
		}
		line = append(line, b[0])
	}
	f := bytes.Fields(line)
	if len(f) != 2 || string(f[0]) != "OK" {
		conn.Close()
		return nil, fmt.Errorf("hybrid vsock: port %d refused: %.32q", port, line)
	}
	if _, err := strconv.ParseUint(string(f[1]), 10, 32); err != nil {
		conn.Close()
		return nil, fmt.Errorf("hybrid vsock: port %d: bad reply %.32q", port, line)
	}
	conn.SetDeadline(time.Time{})
	return conn, nil
}
