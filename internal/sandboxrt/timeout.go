package sandboxrt

import (
	"context"
	"time"

	"github.com/harebox/harebox/sandbox"
)

// SetTimeout sets when a running or paused sandbox expires: ttl from now
// (the reaper deletes it then, as a create's TTL does), or never for a ttl
// of 0. It replaces whatever TTL the sandbox had, shorter or longer.
func (e *Runtime) SetTimeout(ctx context.Context, id string, ttl time.Duration) (_ *sandbox.Sandbox, err error) {
	defer e.audited(ctx, "setSandboxTimeout", id, &err)
	if err := e.check(ctx, "setSandboxTimeout", id); err != nil {
		return nil, err
	}
	if ttl < 0 || ttl > sandbox.MaxTTL {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "ttl_seconds", "must be between 0 (no TTL) and %d (30 days)", int64(sandbox.MaxTTL/time.Second))
	}
	b, err := e.liveOrErr(ctx, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if st := b.rec.State; st != sandbox.StateRunning && st != sandbox.StatePaused {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is %s", id, st)
	}
	old := b.rec.ExpiresAt
	b.rec.ExpiresAt = nil
	if ttl > 0 {
		// (The reaper compares with the wall clock, so this does too.)
		exp := time.Now().Add(ttl)
		b.rec.ExpiresAt = &exp
	}
	if err := e.store.PutSandbox(ctx, b.rec); err != nil {
		b.rec.ExpiresAt = old
		return nil, err
	}
	return b.view(), nil
}
