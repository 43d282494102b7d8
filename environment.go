package harebox

import (
	"context"
	"io"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/env"
	"github.com/harebox/harebox/guestenv"
)

// What a guest is given is package guestenv's: the engine calls it at
// fixed points of a sandbox's life (Pin in the create's transaction, its
// Prepare steps at create, its Load calls when a sandbox runs again,
// Deliver after every boot, Erase at delete), gives it the live
// sandboxes' Guests (sandboxView.Guest) and the agent with its errors
// translated (guestAgent); the box holds what its sandbox is given.

// Environments manages environments, for the principal in the context.
func (e *Engine) Environments() *env.Service { return e.envs }

// guest is the box's sandbox as package guestenv's calls take it.
func (b *box) guest() guestenv.Sandbox {
	return guestenv.Sandbox{Rec: b.rec, Key: b.keys.Data, Guest: &b.given}
}

// Guest implements guestenv.Sandboxes: what live sandbox id is given, or
// nil.
func (s sandboxView) Guest(id string) *guestenv.Guest {
	if b := s.e.boxes.get(id); b != nil {
		return &b.given
	}
	return nil
}

// guestAgent is a guest's agent as package guestenv sees it: its errors
// translated (agentErr) at this boundary.
type guestAgent struct{ c *agentclient.Client }

func (a guestAgent) Stat(ctx context.Context, path string) (agentclient.FileInfo, error) {
	fi, err := a.c.Stat(ctx, path)
	return fi, translated(err)
}

func (a guestAgent) ReadFile(ctx context.Context, path string, w io.Writer, offset, limit int64) (int64, error) {
	n, err := a.c.ReadFile(ctx, path, w, offset, limit)
	return n, translated(err)
}

func (a guestAgent) WriteFile(ctx context.Context, path string, r io.Reader, o agentclient.WriteOptions) (agentclient.FileInfo, error) {
	fi, err := a.c.WriteFile(ctx, path, r, o)
	return fi, translated(err)
}

// translated is agentErr for an error that may be nil.
func translated(err error) error {
	if err == nil {
		return nil
	}
	return agentErr(err)
}
