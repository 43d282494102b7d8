// Package netcapture records the frames on a link for tests that must
// show what crosses it (the mesh's tunnels: WireGuard's UDP only, no
// plaintext), with a packet socket of the kernel's (AF_PACKET).
package netcapture

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/internal/inns"
)

// Capture records frames until Stop.
type Capture struct {
	fd     int
	mu     sync.Mutex
	frames [][]byte
	quit   chan struct{}
	done   chan struct{}
}

// Start records every frame on interface ifname of network namespace ns
// ("" for this process's); the test's end stops it.
func Start(t testing.TB, ns, ifname string) *Capture {
	t.Helper()
	var fd int
	var err error
	open := func() {
		// (Protocol 0: nothing until the bind to the one interface, or
		// the socket would hold frames of every interface meanwhile.)
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0); err != nil {
			return
		}
		var ifi *net.Interface
		if ifi, err = net.InterfaceByName(ifname); err == nil {
			err = unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index})
		}
	}
	if ns == "" {
		open()
	} else if nerr := inns.Run(ns, open); nerr != nil {
		err = nerr
	}
	if err != nil {
		t.Fatalf("netcapture: %s in %q: %v", ifname, ns, err)
	}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100_000})
	c := &Capture{fd: fd, quit: make(chan struct{}), done: make(chan struct{})}
	go c.read()
	t.Cleanup(func() { c.Stop() })
	return c
}

func (c *Capture) read() {
	defer close(c.done)
	buf := make([]byte, 65536)
	for {
		select {
		case <-c.quit:
			return
		default:
		}
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			continue
		}
		c.mu.Lock()
		c.frames = append(c.frames, bytes.Clone(buf[:n]))
		c.mu.Unlock()
	}
}

// Stop ends the capture (again: nothing) and returns its frames.
func (c *Capture) Stop() [][]byte {
	select {
	case <-c.quit:
	default:
		close(c.quit)
		<-c.done
		unix.Close(c.fd)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames
}

// UDPOnly checks frames: none holds plaintext; every frame is ARP or an
// IPv4 UDP datagram from port to port (turn IPv6 off on the link). It
// returns how many datagrams there were.
func UDPOnly(frames [][]byte, plaintext []byte, port uint16) (int, error) {
	n := 0
	for _, f := range frames {
		if bytes.Contains(f, plaintext) {
			return n, fmt.Errorf("%q crossed the link in plaintext", plaintext)
		}
		if len(f) < 14 {
			return n, fmt.Errorf("a runt frame: %x", f)
		}
		switch binary.BigEndian.Uint16(f[12:]) {
		case unix.ETH_P_ARP:
			continue
		case unix.ETH_P_IP:
		default:
			return n, fmt.Errorf("a frame of ethertype %#x on the link", binary.BigEndian.Uint16(f[12:]))
		}
		ip := f[14:]
		if len(ip) < 20 || ip[9] != unix.IPPROTO_UDP || len(ip) < int(ip[0]&0xf)*4+8 {
			return n, fmt.Errorf("an IPv4 packet of protocol %d on the link", ip[9])
		}
		udp := ip[int(ip[0]&0xf)*4:]
		if sp, dp := binary.BigEndian.Uint16(udp[0:]), binary.BigEndian.Uint16(udp[2:]); sp != port || dp != port {
			return n, fmt.Errorf("UDP %d -> %d on the link", sp, dp)
		}
		n++
	}
	return n, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
