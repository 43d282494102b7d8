package sandboxrt

import (
	"context"

	"github.com/harebox/harebox/files"
)

// A running sandbox's files are package files': it authorizes and audits
// each call on its sandbox and speaks to the sandbox's agent, which the
// runtime lends it (fileView).

// fileView implements files.Sandboxes.
type fileView struct{ sandboxView }

func (v fileView) Running(ctx context.Context, id string) (files.Agent, error) {
	_, c, err := v.e.connect(ctx, id)
	if err != nil {
		return nil, err
	}
	return c, nil
}
