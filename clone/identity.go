package clone

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/network"
)

// NewIdentity gives a restored guest what must differ from its source's:
// fresh kernel entropy, a new machine-id and its own network. A woken
// sandbox (wake) is its own source: it gets only its network.
func NewIdentity(ctx context.Context, c *agentclient.Client, att *network.Attachment, wake bool) error {
	if wake {
		if att != nil && att.Cmdline != "" {
			return c.SetNetwork(ctx, att.Cmdline)
		}
		return nil
	}
	entropy := make([]byte, 64)
	id := make([]byte, 16)
	if _, err := rand.Read(entropy); err != nil {
		return err
	}
	if _, err := rand.Read(id); err != nil {
		return err
	}
	if err := c.Reseed(ctx, entropy, hex.EncodeToString(id), ""); err != nil {
		return err
	}
	if att != nil && att.Cmdline != "" {
		if err := c.SetNetwork(ctx, att.Cmdline); err != nil {
			return err
		}
	}
	return nil
}
