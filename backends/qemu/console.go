package qemu

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"sync"
	"time"

	"github.com/harebox/harebox/hypervisor/consolelog"
)

// An encrypted console (Spec.ConsoleRecipient): QEMU keeps the guest's
// console in a ring buffer in its own memory, never in a file, and this
// process moves it to the log, encrypted, every drainInterval. The ring
// keeps the newest ringSize bytes while nobody drains (a plugin restart);
// output older than that, and at most one interval's before the VMM
// exits, is lost.
const (
	ringSize      = 1 << 20
	ringRead      = 512 << 10 // base64 in one QMP line stays under qmpMaxLine
	drainInterval = 500 * time.Millisecond
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
		t := time.NewTicker(drainInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if !m.st.Proc.alive() {
				return
			}
			m.drainOnce(ctx, app)
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			s, err := m.status(sctx)
			cancel()
			if err == nil && s == "shutdown" {
				// The guest is done (-action shutdown=pause): what it
				// printed last is in the log now, so QEMU may go.
				m.drainOnce(ctx, app)
				qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				m.exec(qctx, "quit", nil)
				cancel()
				return
			}
		}
	}()
	return nil
}

// drainOnce moves what the ring holds to the log.
func (m *machine) drainOnce(ctx context.Context, app *consolelog.Appender) {
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		out, err := m.exec(cctx, "ringbuf-read", map[string]any{"device": "serial0", "size": ringRead, "format": "base64"})
		cancel()
		if err != nil {
			return
		}
		var s string
		if json.Unmarshal(out, &s) != nil || s == "" {
			return
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(b) == 0 {
			return
		}
		if err := app.Append(b); err != nil {
			m.d.opts.Logger.Warn("qemu: console log", "id", m.ID(), "err", err)
			return
		}
		if len(b) < ringRead {
			return
		}
	}
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
