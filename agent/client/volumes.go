package client

import (
	"context"

	"github.com/harebox/harebox/agent/agentpb"
)

// MountVolume mounts the plugged-in disk whose serial is serial at path,
// read-only or not; a writable one's fresh root goes to owner ("" is the
// default user). Protocol 5.
func (c *Client) MountVolume(ctx context.Context, serial, path string, readOnly bool, owner string) (err error) {
	defer classify(&err)
	if err := c.need(5, "volumes"); err != nil {
		return err
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	if _, err := c.rpc.MountVolume(ctx, &agentpb.MountVolumeRequest{Serial: serial, Path: path, ReadOnly: readOnly, Owner: owner}); err != nil {
		return c.wrap("mount volume", err)
	}
	return nil
}

// UnmountVolume syncs and unmounts the volume at path. Protocol 5.
func (c *Client) UnmountVolume(ctx context.Context, path string) (err error) {
	defer classify(&err)
	if err := c.need(5, "volumes"); err != nil {
		return err
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	if _, err := c.rpc.UnmountVolume(ctx, &agentpb.PathRequest{Path: path}); err != nil {
		return c.wrap("unmount volume", err)
	}
	return nil
}
