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
}

// ImageBuildRequest builds an image from an OCI image in a registry.
type ImageBuildRequest struct {
	// Name is the image's name: lower-case letters, digits and dashes,
	// not minimal or default.
	Name string `json:"name" validate:"required,max=63,imagename"`
	// From is "registry:REF" (e.g. registry:ghcr.io/org/app:1).
	From string `json:"from" validate:"required,max=1024"`
}
