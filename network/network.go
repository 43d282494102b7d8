// Package network is the engine's interface to a sandbox's host-side
// network. The Linux implementation (tap, nftables, DNS, egress proxy)
// implements it; None gives sandboxes no network.
package network

import "context"

// Network prepares and removes a sandbox's host-side network.
type Network interface {
	// Attach prepares the host side before the sandbox's VM boots, with its
	// firewall already in force, and says what the VM gets.
	Attach(ctx context.Context, sandboxID string) (*Attachment, error)
	// Detach removes everything Attach made. It is idempotent.
	Detach(ctx context.Context, sandboxID string) error
	// Prune removes what belongs to sandboxes not in keep (engine start).
	Prune(ctx context.Context, keep []string) error
}

// Attachment is what a VM gets: a tap device with a MAC, and kernel
// command-line parameters that tell the guest agent its addresses.
type Attachment struct {
	Tap     string `json:"tap"`
	MAC     string `json:"mac"`
	Cmdline string `json:"cmdline,omitempty"`
}

// None gives sandboxes no network at all.
type None struct{}

func (None) Attach(context.Context, string) (*Attachment, error) { return nil, nil }
func (None) Detach(context.Context, string) error                { return nil }
func (None) Prune(context.Context, []string) error               { return nil }
