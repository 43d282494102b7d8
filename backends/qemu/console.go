package qemu

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"sync"
	"time"

	"github.com/harebox/harebox/hypervisor/consolelog"
	"github.com/harebox/harebox/hypervisor/qmp"
)

// An encrypted console (Spec.ConsoleRecipient): QEMU keeps the guest's
// console in a ring buffer in its own memory, never in a file, and this
// process moves it to the log, encrypted: every drainInterval while the
// guest writes to it, backing off to every drainIdle while it is quiet
// (each drain is a QMP session, and a host of idle sandboxes paid more
// for draining empty rings, four sessions a second each, than for the
// guests themselves). The ring keeps the newest ringSize bytes while
// nobody drains (a plugin restart); output older than that, and at most
// one interval's before the VMM exits, is lost.
const (
	ringSize      = 1 << 20
	ringRead      = 512 << 10 // base64 in one QMP line stays under qmpMaxLine
	drainInterval = 500 * time.Millisecond
	drainIdle     = 2 * time.Second
)

// drains are the consoles this process drains, by machine ID, so that a
// machine attached twice is drained once.
type drains struct {
	mu sync.Mutex
	m  map[string]*drainer
}

type drainer struct {
	cancel context.CancelFunc
	done   chan struct{}
	proc   proc // the VMM it drains
}

// startDrain drains m's console until its VMM exits or stopDrain.
func (d *Driver) startDrain(m *machine) error {
	if m.st.Spec.ConsoleRecipient == "" {
		return nil
	}
	app, err := consolelog.NewAppender(m.st.Serial, m.st.Spec.ConsoleRecipient, consolelog.MaxBytes)
	if err != nil {
		return err
	}
	d.drains.mu.Lock()
	defer d.drains.mu.Unlock()
	if d.drains.m == nil {
		d.drains.m = map[string]*drainer{}
	}
	if old, ok := d.drains.m[m.ID()]; ok {
		if old.proc == m.st.Proc {
			return nil // (already draining this VMM)
		}
		// An earlier VMM of this machine (launched again on its disks):
		// its drainer ends with it; this one's starts now.
		old.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	dr := &drainer{cancel: cancel, done: make(chan struct{}), proc: m.st.Proc}
	d.drains.m[m.ID()] = dr
	go func() {
		defer close(dr.done)
		defer func() {
			d.drains.mu.Lock()
			if d.drains.m[m.ID()] == dr {
				delete(d.drains.m, m.ID())
			}
			d.drains.mu.Unlock()
		}()
		every := drainInterval
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(every):
			}
			if !m.st.Proc.alive() {
				return
			}
			n, status := m.drain(ctx, app)
			if status == "shutdown" {
				// The guest is done (-action shutdown=pause): once what
				// it printed last is in the log, QEMU may go.
				m.drain(ctx, app)
				qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				m.exec(qctx, "quit", nil)
				cancel()
				return
			}
			if n > 0 {
				every = drainInterval
			} else {
				every = min(2*every, drainIdle)
			}
		}
	}()
	return nil
}

// drain moves what the ring holds to the log and asks for the machine's
// status after, in one QMP session: it returns how many bytes it moved
// and the status ("" if it could not tell).
func (m *machine) drain(ctx context.Context, app *consolelog.Appender) (moved int, status string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m.session(ctx, func(q *qmp.Client) error {
		for {
			out, err := q.Execute(ctx, "ringbuf-read", map[string]any{"device": "serial0", "size": ringRead, "format": "base64"})
			if err != nil {
				return err
			}
			var s string
			if json.Unmarshal(out, &s) != nil || s == "" {
				break
			}
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil || len(b) == 0 {
				break
			}
			if err := app.Append(b); err != nil {
				m.d.opts.Logger.Warn("qemu: console log", "id", m.ID(), "err", err)
				break
			}
			moved += len(b)
			if len(b) < ringRead {
				break
			}
		}
		status, _ = queryStatus(ctx, q)
		return nil
	})
	return moved, status
}

// stopDrain stops draining id's console and waits for the drainer.
func (d *Driver) stopDrain(id string) {
	d.drains.mu.Lock()
	dr := d.drains.m[id]
	d.drains.mu.Unlock()
	if dr != nil {
		dr.cancel()
		<-dr.done
	}
}
