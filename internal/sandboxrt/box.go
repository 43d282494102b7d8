package sandboxrt

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"

	"github.com/harebox/harebox/guestenv"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// The box: a live sandbox's handle (its record, machine and agent
// connection, under its own lock), the watcher of its VM's exit beside
// it, and the engine's table of them.

// box is a live sandbox: its record, its machine and its agent connection.
type box struct {
	// mu serialises lifecycle changes (pause, resume, delete) of one box.
	mu  sync.Mutex
	rec *store.Sandbox
	m   hypervisor.Machine

	amu   sync.Mutex
	agent *agentclient.Client
	// hangup is why the host hung up on the agent for good (a delete,
	// stop or hibernate under way): no call dials it again until a new
	// machine runs (useMachine).
	hangup error

	// given is what the sandbox is given (package guestenv): the
	// variables every exec gets, what the credential proxy needs.
	given guestenv.Guest
	// health is the agent's last known health (a string); misses counts
	// the checks in a row it failed (only the health checker uses it).
	health atomic.Value
	misses int
	// keys are the sandbox's data key and the identity that reads its
	// console log (package sandboxkeys); none without crypto-erase.
	keys sandboxkeys.Keys
	// deleting is closed when Delete starts, so the exit watcher knows the
	// VM's exit is expected.
	deleting     chan struct{}
	deletingOnce sync.Once
	// phases times a create's steps (nil otherwise).
	phases *phases
	// gone, once set (under mu), is why the box no longer stands for its
	// sandbox here (it moved to another host, or a move let go of it): a
	// call that waited for its lock gets it and tries again.
	gone error
}

func (b *box) view() *sandbox.Sandbox {
	s := b.rec.Sandbox
	if h, ok := b.health.Load().(string); ok && s.State == sandbox.StateRunning {
		s.Agent = h
	}
	return &s
}

// client returns a live agent connection, redialling when the last one
// died (agent restart, VM restore, keepalive timeout).
func (b *box) client(ctx context.Context, e *Runtime) (*agentclient.Client, error) {
	b.amu.Lock()
	defer b.amu.Unlock()
	if b.hangup != nil {
		return nil, b.hangup
	}
	if b.agent != nil {
		select {
		case <-b.agent.Done():
			// (Why, for the record: a session's end is rare, and its
			// cause otherwise lost; one line per session.)
			e.log.Info("agent session ended; redialling", "sandbox", b.m.ID(), "reason", b.agent.EndReason())
			b.agent.Close()
			b.agent = nil
		default:
			return b.agent, nil
		}
	}
	// A boot passes its own (long) deadline; other callers get 30 s.
	dctx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		dctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	}
	defer cancel()
	c, _, err := agentclient.DialReady(dctx, b.m.AgentEndpoint(), e.AgentOptions())
	if err != nil {
		return nil, err
	}
	b.agent = c
	return c, nil
}

// useMachine makes m the box's machine; its agent may be called.
func (b *box) useMachine(m hypervisor.Machine) {
	b.m = m
	b.amu.Lock()
	b.hangup = nil
	b.amu.Unlock()
}

// hangUp hangs up on b's agent (closeAgent) and has the services that
// keep something of its guest forget it: its machine goes.
func (e *Runtime) hangUp(b *box, why error) {
	b.closeAgent(why)
	e.processes.Forget(b.rec.ID)
	e.code.Forget(b.rec.ID)
}

// closeAgent hangs up on the sandbox's agent for good: a call it cuts
// short, and any call after it, fails with why (a sandbox error).
func (b *box) closeAgent(why error) {
	b.amu.Lock()
	defer b.amu.Unlock()
	b.hangup = why
	if b.agent != nil {
		b.agent.CloseFor(why)
		b.agent = nil
	}
}

// isDeleting reports whether a Delete of the box has begun.
func (b *box) isDeleting() bool {
	select {
	case <-b.deleting:
		return true
	default:
		return false
	}
}

// roundLockWait is how long a background round waits for busy boxes, in
// all.
const roundLockWait = 500 * time.Millisecond

// lockBy locks the box if it can by deadline (one per round, shared by its
// boxes). Background rounds (metering, monitoring) use it: a short hold
// (the other round's store write) is waited out, so two rounds on the same
// tick do not keep skipping each other, while long lifecycle calls (a hung
// hypervisor, a delete) hold the round up by roundLockWait at most.
func (b *box) lockBy(deadline time.Time) bool {
	for ; ; time.Sleep(5 * time.Millisecond) {
		if b.mu.TryLock() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// AgentOptions are how the runtime dials its sandboxes' agents.
func (e *Runtime) AgentOptions() agentclient.Options {
	return agentclient.Options{MaxOutput: e.opts.MaxOutputBytes}
}

// liveOrErr returns a live box or the error that explains why there is none.
func (e *Runtime) liveOrErr(ctx context.Context, id string) (*box, error) {
	if b := e.boxes.get(id); b != nil {
		return b, nil
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is %s", id, rec.State)
}

func (e *Runtime) record(ctx context.Context, id string) (*store.Sandbox, error) {
	if !sandbox.ValidID(id) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no sandbox %q", id)
	}
	rec, err := e.store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no sandbox %q", id)
	}
	return rec, err
}

// stopped records that a sandbox's VM is gone and removes its leftovers.
func (e *Runtime) stopped(ctx context.Context, b *box, why string) {
	e.destroy(ctx, b)
	b.rec.State, b.rec.Error, b.rec.Kept = sandbox.StateStopped, why, false
	e.store.PutSandbox(ctx, b.rec)
}

// watch notices a VM that exits on its own (guest poweroff, crash, OOM
// kill) and marks its sandbox stopped.
func (e *Runtime) watch(b *box) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			err := b.m.Wait(e.ctx)
			if e.ctx.Err() != nil {
				return // the engine is closing; the VM keeps running
			}
			select {
			case <-b.deleting:
				return
			default:
			}
			if err == nil {
				break
			}
			// Wait itself failed (a plugin problem): trust Info, not Wait,
			// and keep watching while the VM runs.
			if info, ierr := b.m.Info(e.ctx); ierr == nil && info.State == hypervisor.StateStopped {
				break
			}
			e.log.Warn("watching sandbox VM failed; retrying", "id", b.rec.ID, "err", err)
			select {
			case <-e.ctx.Done():
				return
			case <-b.deleting:
				return
			case <-time.After(5 * time.Second):
			}
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.rec.State == sandbox.StateDeleted || b.rec.State == sandbox.StateStopped || b.rec.State == sandbox.StateHibernated {
			return // (a call stopped it)
		}
		ctx := context.WithoutCancel(e.ctx)
		e.log.Warn("sandbox VM exited", "id", b.rec.ID)
		e.meter.Final(ctx, b.rec)
		e.capacity.Release(b.rec.Size)
		e.stopped(ctx, b, "the VM exited: "+exitReason(consoleTail(b, 16<<10)))
		e.audit.RecordEvent("engine", b.rec.AccountID, "vmExited", b.rec.ID)
		e.boxes.drop(b.rec.ID, nil)
	}()
}

// exitReason is what a VM's console says about its end: the kernel's
// panic line if it panicked (the trace after it ends in register dumps),
// else its last line.
func exitReason(console string) string {
	if i := strings.LastIndex(console, "Kernel panic - "); i >= 0 {
		line := console[i:]
		if j := strings.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		return strings.TrimSpace(line)
	}
	return lastLine(console)
}

func lastLine(s string) string {
	if i := bytes.LastIndexByte([]byte(s), '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
