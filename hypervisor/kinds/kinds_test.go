package kinds_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/kinds"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/model"
)

// A backend's errors, through the wrapper, are of the API's kinds and
// keep the backend's own (errors.Is finds both).
func TestWrapTranslates(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	h := kinds.Wrap(memhv.New(memhv.Options{}))

	_, err := h.Launch(ctx, hypervisor.Spec{ID: "bad id!"})
	if !errors.Is(err, model.ErrInvalid) || !errors.Is(err, hypervisor.ErrInvalid) || !strings.HasPrefix(err.Error(), "the hypervisor refused the request: launch: ") {
		t.Errorf("launch of a bad spec: %v", err)
	}

	img := memhv.Image(dir)
	m, err := h.Launch(ctx, hypervisor.Spec{ID: "m1", VCPUs: 1, MemoryMB: 256, Kernel: img.Kernel, Initrd: img.Initrd, StateDir: filepath.Join(dir, "m1")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill(ctx); m.Wait(ctx); m.Cleanup(ctx) })
	if err := m.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	m.Wait(ctx)
	if _, err := h.Attach(ctx, m.Handle()); !errors.Is(err, model.ErrUnavailable) || !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("attach to a machine that is gone: %v", err)
	}
	if err := m.Pause(ctx); !errors.Is(err, model.ErrState) || !errors.Is(err, hypervisor.ErrState) {
		t.Errorf("pause of a stopped machine: %v", err)
	}
}

func TestOf(t *testing.T) {
	if kinds.Of("launch", nil) != nil {
		t.Error("nil is not nil")
	}
	full := kinds.Of("snapshot", fmt.Errorf("qemu-img: write: No space left on device"))
	if !errors.Is(full, model.ErrCapacity) {
		t.Errorf("a full disk: %v", full)
	}
	if err := kinds.Of("launch", errors.New("plugin crashed")); !errors.Is(err, model.ErrUnavailable) || err.Error() != "the hypervisor failed: launch: plugin crashed" {
		t.Errorf("no kind: %v", err)
	}
	// One with a kind already passes as it is.
	kinded := &model.Error{Kind: model.ErrTimeout, Msg: "slow"}
	if err := kinds.Of("x", fmt.Errorf("wrapped: %w", kinded)); !errors.Is(err, model.ErrTimeout) {
		t.Errorf("kinded: %v", err)
	}
}
