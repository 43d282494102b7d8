package sandboxrt

import (
	"context"
	"sync"
	"time"

	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
)

// Agent health values.
const (
	agentOK           = "ok"
	agentUnresponsive = "unresponsive"
	// missesAllowed checks in a row may fail before a sandbox's agent is
	// reported unresponsive: a busy guest under software emulation can be
	// slow to answer once.
	missesAllowed = 1
	// maxHealthChecks bounds the checks in flight at once.
	maxHealthChecks = 16
)

// watchAgents asks every running sandbox's agent for its health every
// interval, so a sandbox whose agent died and stays dead is reported as
// such instead of as a healthy running one.
func (e *Runtime) watchAgents(interval time.Duration) {
	defer e.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
		if c, ok := e.net.(network.Checker); ok {
			// A firewall altered on the host is put back within an
			// interval, whether or not anyone asks /ready.
			c.Check(e.ctx)
		}
		boxes := e.boxes.all()
		var wg sync.WaitGroup
		sem := make(chan struct{}, maxHealthChecks)
		for _, b := range boxes {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				e.checkAgent(b, min(interval, 10*time.Second))
			}()
		}
		wg.Wait()
	}
}

// checkAgent checks one sandbox's agent and records the result.
func (e *Runtime) checkAgent(b *box, timeout time.Duration) {
	b.mu.Lock()
	running := b.rec.State == sandbox.StateRunning
	b.mu.Unlock()
	if !running {
		return
	}
	ctx, cancel := context.WithTimeout(e.ctx, timeout)
	defer cancel()
	c, err := b.client(ctx, e)
	if err == nil {
		_, err = c.Health(ctx)
	}
	if e.ctx.Err() != nil {
		return
	}
	was, _ := b.health.Load().(string)
	now := was
	if err == nil {
		now, b.misses = agentOK, 0
	} else if b.misses++; b.misses > missesAllowed {
		now = agentUnresponsive
	}
	b.health.Store(now)
	if now != was && was != "" {
		e.log.Warn("sandbox agent health changed", "id", b.rec.ID, "agent", now, "err", err)
	}
}
