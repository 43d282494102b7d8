package hvsock

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// vsockPeer runs a Unix-socket peer that reads the CONNECT line and then
// does what reply says; it returns the socket path and the CONNECT lines
// it received.
func vsockPeer(t *testing.T, reply func(c net.Conn, connect string)) (string, <-chan string) {
	t.Helper()
	sock := filepath.Join(shortTempDir(t), "v.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 4)
	stop := make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReaderSize(c, 16).ReadString('\n')
				got <- line
				reply(c, line)
				<-stop
			}()
		}
	}()
	t.Cleanup(func() { close(stop); ln.Close() })
	return sock, got
}

func TestHybridVsockOK(t *testing.T) {
	sock, got := vsockPeer(t, func(c net.Conn, line string) {
		// The OK line and the first stream bytes in one write: the dialer
		// must not lose them.
		c.Write([]byte("OK 1073741824\nhello"))
		io.Copy(c, c)
	})
	conn, err := DialHybridVsock(testCtx(t), sock, 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if line := <-got; line != "CONNECT 1024\n" {
		t.Fatalf("peer got %q", line)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("first bytes = %q, %v", buf, err)
	}
	conn.Write([]byte("ping"))
	buf = make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo = %q, %v", buf, err)
	}
	if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
}

func TestHybridVsockFailures(t *testing.T) {
	cases := []struct {
		name  string
		reply func(net.Conn, string)
		want  string
	}{
		{"refused", func(net.Conn, string) {}, "closed before a reply"},
		{"garbage line", func(c net.Conn, _ string) { c.Write([]byte("HELLO THERE\n")) }, "unexpected reply"},
		{"not a number", func(c net.Conn, _ string) { c.Write([]byte("OK port\n")) }, "unexpected reply"},
		{"number too big", func(c net.Conn, _ string) { c.Write([]byte("OK 99999999999\n")) }, "unexpected reply"},
		{"no newline", func(c net.Conn, _ string) { c.Write([]byte(strings.Repeat("x", 64))) }, "no newline"},
		{"cut short", func(c net.Conn, _ string) { c.Write([]byte("OK 12")) }, "closed in the middle"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock, _ := vsockPeer(t, func(c net.Conn, line string) {
				tc.reply(c, line)
				c.Close()
			})
			conn, err := DialHybridVsock(testCtx(t), sock, 1024)
			if err == nil {
				conn.Close()
				t.Fatal("dial succeeded")
			}
			if !errors.Is(err, ErrHandshake) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestHybridVsockSilentPeer(t *testing.T) {
	sock, _ := vsockPeer(t, func(net.Conn, string) {})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := DialHybridVsock(ctx, sock, 1024)
	if err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("silent peer: %v after %v", err, time.Since(start))
	}
	if !errors.Is(err, ErrHandshake) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("silent peer: %v", err)
	}

	// Cancelling (rather than a deadline) also ends the handshake.
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start = time.Now()
	if _, err := DialHybridVsock(ctx, sock, 1024); !errors.Is(err, context.Canceled) || time.Since(start) > 2*time.Second {
		t.Fatalf("cancelled: %v after %v", err, time.Since(start))
	}
}

func TestHybridVsockNoSocket(t *testing.T) {
	if _, err := DialHybridVsock(testCtx(t), filepath.Join(shortTempDir(t), "none.sock"), 1024); err == nil {
		t.Fatal("dial to a missing socket succeeded")
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// shortTempDir keeps Unix socket paths under their 107-byte limit.
func shortTempDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "hvs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}
