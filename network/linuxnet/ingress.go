package linuxnet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/network"
)

// DefaultIngressMark is the socket mark of the ingress's connections to
// guests ("HB" and 1); the firewall lets in only packets that carry it,
// to the ports a sandbox exposes.
const DefaultIngressMark = 0x48420001

var _ network.Ingress = (*Network)(nil)

// DialGuest implements network.Ingress.
func (n *Network) DialGuest(ctx context.Context, id string, port uint16) (net.Conn, error) {
	if port == 0 {
		return nil, fmt.Errorf("linuxnet: port 0")
	}
	n.mu.Lock()
	b, ok := n.boxes[id]
	if !ok {
		n.mu.Unlock()
		return nil, fmt.Errorf("linuxnet: sandbox %s is not attached", id)
	}
	if !slices.Contains(b.Exposed, port) {
		if err := n.expose(b, append(slices.Clone(b.Exposed), port)); err != nil {
			n.mu.Unlock()
			return nil, err
		}
	}
	_, guest := n.addrs(b.Slot)
	n.mu.Unlock()
	d := net.Dialer{Timeout: 10 * time.Second, Control: markSocket(n.opts.IngressMark)}
	c, err := d.DialContext(ctx, "tcp4", netip.AddrPortFrom(guest, port).String())
	if err != nil {
		return nil, err
	}
	gc := &guestConn{Conn: c, b: b}
	b.dmu.Lock()
	defer b.dmu.Unlock()
	if b.closed { // detached while dialing
		c.Close()
		return nil, fmt.Errorf("linuxnet: sandbox %s is not attached", id)
	}
	if b.dialed == nil {
		b.dialed = map[*guestConn]struct{}{}
	}
	b.dialed[gc] = struct{}{}
	return gc, nil
}

// guestConn is a connection of the ingress to a guest.
type guestConn struct {
	net.Conn
	b    *box
	once sync.Once
}

func (c *guestConn) Close() error {
	c.once.Do(func() {
		c.b.dmu.Lock()
		delete(c.b.dialed, c)
		c.b.dmu.Unlock()
	})
	return c.Conn.Close()
}

// closeDialed closes the ingress's connections to a box being detached,
// and any it makes from now on.
func (b *box) closeDialed() {
	b.dmu.Lock()
	b.closed = true
	conns := b.dialed
	b.dialed = nil
	b.dmu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
}

// toGuest matches the conntrack flows from the host to a guest address.
type toGuest netip.Addr

func (g toGuest) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	dst, _ := netip.AddrFromSlice(f.Forward.DstIP.To4())
	return dst == netip.Addr(g)
}

// markSocket is a dialer's Control that marks its socket (SO_MARK).
func markSocket(mark uint32) func(_, _ string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) {
			err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
		}); cerr != nil {
			return cerr
		}
		return err
	}
}

// ClosePorts implements network.Ingress.
func (n *Network) ClosePorts(ctx context.Context, id string, ports ...uint16) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.boxes[id]
	if !ok {
		return nil // nothing is open for a sandbox that is not attached
	}
	keep := slices.DeleteFunc(slices.Clone(b.Exposed), func(p uint16) bool { return slices.Contains(ports, p) })
	if len(keep) == len(b.Exposed) {
		return nil
	}
	return n.expose(b, keep)
}

// expose installs b's rules with ports exposed, in one transaction, and
// saves them. The caller holds n.mu.
func (n *Network) expose(b *box, ports []uint16) error {
	slices.Sort(ports)
	ports = slices.Compact(ports)
	old := b.Exposed
	b.Exposed = ports
	if err := n.table.Put(n.sandbox(b)); err != nil {
		b.Exposed = old
		return err
	}
	if err := n.save(b); err != nil {
		n.log.Error("linuxnet: exposed ports in force but not saved", "id", b.ID, "err", err)
	}
	return nil
}
