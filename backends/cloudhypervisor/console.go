package cloudhypervisor

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/harebox/harebox/hypervisor/consolelog"
)

// An encrypted console (Spec.ConsoleRecipient): the VMM serves the
// guest's serial port on a Unix socket in the state dir (serial mode
// Socket) instead of writing it to a file, and this process moves what
// it reads there to the log, encrypted (hypervisor/consolelog). While
// nobody is connected (a plugin restart) the output is the VMM's to keep
// or drop; a re-attached machine is drained again.

// drains are the consoles this process drains, by machine ID, so that a
// machine attached twice is drained once.
type drains struct {
	mu sync.Mutex
	m  map[string]*drainer
}

type drainer struct {
	pid    int
	cancel context.CancelFunc
	done   chan struct{}
}

// serialReadSize bounds one read, and so one record of the log.
const serialReadSize = 32 << 10

// startDrain drains m's serial socket into its log until the VMM exits
// or m.stopDrain is called.
func (b *Backend) startDrain(m *machine) error {
	if m.data.ConsoleRecipient == "" {
		return nil
	}
	app, err := consolelog.NewAppender(m.data.SerialLog, m.data.ConsoleRecipient, consolelog.MaxBytes)
	if err != nil {
		return err
	}
	b.drains.mu.Lock()
	defer b.drains.mu.Unlock()
	if b.drains.m == nil {
		b.drains.m = map[string]*drainer{}
	}
	if old := b.drains.m[m.id]; old != nil {
		select {
		case <-old.done:
		default:
			if old.pid == m.data.PID {
				m.stopDrain = b.stopper(m.id, old)
				return nil // (already draining this VMM)
			}
			// An earlier VMM's: it ends before this one's starts, so
			// two never append to the log at once.
			old.cancel()
			<-old.done
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	dr := &drainer{pid: m.data.PID, cancel: cancel, done: make(chan struct{})}
	b.drains.m[m.id] = dr
	m.stopDrain = b.stopper(m.id, dr)
	proc := m.proc
	go func() {
		defer close(dr.done)
		buf := make([]byte, serialReadSize)
		for ctx.Err() == nil && !proc.exited() {
			conn, err := net.Dial("unix", m.data.SerialSocket)
			if err != nil {
				// (Not served yet, or the VMM is going.)
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
				continue
			}
			stop := context.AfterFunc(ctx, func() { conn.Close() })
			for {
				n, err := conn.Read(buf)
				if n > 0 {
					// (A full log, or a failing disk, loses the output;
					// reading on keeps the guest's serial port moving.)
					app.Append(buf[:n])
				}
				if err != nil {
					break
				}
			}
			stop()
			conn.Close()
		}
	}()
	return nil
}

// stopper returns the function that stops dr and waits for it.
func (b *Backend) stopper(id string, dr *drainer) func() {
	return func() {
		dr.cancel()
		<-dr.done
		b.drains.mu.Lock()
		if b.drains.m[id] == dr {
			delete(b.drains.m, id)
		}
		b.drains.mu.Unlock()
	}
}
