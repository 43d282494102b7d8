package client

import (
	"context"
	"time"

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

// FreezeVolume freezes the filesystem of the volume at path (what it
// holds is on its disk, and writes wait) for at most d: the guest thaws
// it by itself then, if ThawVolume does not come first. Protocol 7.
func (c *Client) FreezeVolume(ctx context.Context, path string, d time.Duration) (err error) {
	defer classify(&err)
	if err := c.need(7, "freezing a volume"); err != nil {
		return err
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	if _, err := c.rpc.FreezeVolume(ctx, &agentpb.FreezeVolumeRequest{Path: path, Seconds: uint32(max(1, d/time.Second))}); err != nil {
		return c.wrap("freeze volume", err)
	}
	return nil
}

// ThawVolume thaws the volume at path. Protocol 7.
func (c *Client) ThawVolume(ctx context.Context, path string) (err error) {
	defer classify(&err)
	if err := c.need(7, "freezing a volume"); err != nil {
		return err
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	if _, err := c.rpc.ThawVolume(ctx, &agentpb.PathRequest{Path: path}); err != nil {
		return c.wrap("thaw volume", err)
	}
	return nil
}
