package sandbox

import "time"

// Image is a guest image a sandbox can be created from.
type Image struct {
	Name string `json:"name"`
	// From and Digest name the OCI image it was built from, if any.
	From          string    `json:"from,omitempty"`
	Digest        string    `json:"digest,omitempty"`
	KernelVersion string    `json:"kernel_version"`
	BuiltAt       time.Time `json:"built_at"`
	// RootDisk says whether it boots from a root disk (every image but
	// minimal).
	RootDisk bool `json:"root_disk"`
	// Golden are its golden snapshots on the host that answered, one per
	// size a create asked for; PoolIdle, the warm pool's idle sandboxes
	// of it there.
	Golden   []GoldenSnapshot `json:"golden,omitempty"`
	PoolIdle int              `json:"pool_idle"`
}

// GoldenSnapshot is an image's golden snapshot at one size.
type GoldenSnapshot struct {
	Resources
	// State is GoldenMaking (being booted and snapshotted: creates of
	// that size boot meanwhile), GoldenReady or GoldenFailed.
	State string `json:"state"`
}

// A golden snapshot's states.
const (
	GoldenMaking = "making"
	GoldenReady  = "ready"
	GoldenFailed = "failed"
)

// ImageBuildRequest builds an image from an OCI image in a registry.
type ImageBuildRequest struct {
	// Name is the image's name: lower-case letters, digits and dashes,
	// not minimal or default.
	Name string `json:"name" validate:"required,max=63,imagename"`
	// From is "registry:REF" (e.g. registry:ghcr.io/org/app:1).
	From string `json:"from" validate:"required,max=1024"`
}
