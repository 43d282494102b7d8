package harebox

import (
	"context"
	"os"
	"path/filepath"
	"syscall"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/kinds"
	"github.com/harebox/harebox/hypervisor/plugin"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/sandbox"
)

// The hypervisor backend: in-process, or a plugin binary the engine
// starts (and starts again when it dies).

// startHypervisor uses the in-process backend or starts the plugin.
func (e *Engine) startHypervisor(ctx context.Context) error {
	if e.opts.Hypervisor != nil {
		e.hv = kinds.Wrap(e.opts.Hypervisor)
		return nil
	}
	path := e.opts.PluginPath
	if path == "" {
		name := "harebox-plugin-" + e.opts.Backend
		if exe, err := os.Executable(); err == nil {
			if p := filepath.Join(filepath.Dir(exe), name); fileExists(p) {
				path = p
			}
		}
		if path == "" {
			path = name // resolved on PATH by exec
		}
	}
	// A plugin of this data directory that outlived its engine (killed
	// before the parent-death signal existed, or by a race) goes first.
	for _, pr := range procs.WithEnv(plugin.OwnerEnv + "=" + e.opts.DataDir) {
		if pr.IsPlugin() {
			e.log.Warn("killing a stale hypervisor plugin of this data directory", "pid", pr.PID)
			syscall.Kill(pr.PID, syscall.SIGKILL)
		}
	}
	p, err := plugin.Launch(ctx, path, e.opts.PluginArgs, e.opts.DataDir, e.log.With("backend", e.opts.Backend))
	if err != nil {
		return sandbox.Errorf(sandbox.ErrUnavailable, "", "hypervisor plugin %s: %v", path, err)
	}
	e.hv = kinds.Wrap(p)
	e.closer = append(e.closer, p.Close)
	return nil
}

// Capabilities reports the hypervisor backend in use.
func (e *Engine) Capabilities(ctx context.Context) (hypervisor.Capabilities, error) {
	if err := authz.Allowed(authz.From(ctx), "getInfo"); err != nil {
		return hypervisor.Capabilities{}, err
	}
	caps, err := e.hv.Capabilities(ctx)
	return caps, err
}
