package sandboxrt

import (
	"context"

	"github.com/harebox/harebox/codeinterp"
)

// The code interpreter of sandboxes made from an image that has one
// (images.CodeInterpreter) is package codeinterp's: it answers the calls
// (authorized and audited on their sandbox) and speaks to the server in
// the guest through the agent; the engine gives it its running sandboxes
// (codeView) and has it forget a sandbox's client when its machine goes.

// codeView implements codeinterp.Sandboxes.
type codeView struct{ sandboxView }

func (v codeView) Running(ctx context.Context, id string) (*codeinterp.Sandbox, error) {
	b, c, err := v.e.connect(ctx, id)
	if err != nil {
		return nil, err
	}
	rec := b.rec
	interp := func() (bool, error) {
		img, err := v.e.imageOf(rec)
		return img.CodeInterpreter, err
	}
	return &codeinterp.Sandbox{ID: rec.ID, Image: rec.Image, Interpreter: interp,
		Agent: c, Env: b.given.Env(), History: b.historyRef()}, nil
}
