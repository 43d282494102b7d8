package sandbox

import (
	"crypto/rand"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
)

// Snapshot is a sandbox's memory, device state and disk at one moment,
// kept on the host under its own stored key. New sandboxes are made from
// it (create with Snapshot, or Fork); it outlives its source.
type Snapshot struct {
	ID        string `json:"id"`
	Name      string `json:"name,omitempty"`
	AccountID string `json:"account_id"`
	ProjectID string `json:"project_id"`
	// SandboxID is the source sandbox (which may since be deleted).
	SandboxID string            `json:"sandbox_id"`
	Image     string            `json:"image"`
	Size      Resources         `json:"size"`
	Labels    map[string]string `json:"labels,omitempty"`
	// Bytes is what the snapshot's files take on the host.
	Bytes     int64     `json:"bytes"`
	CreatedAt time.Time `json:"created_at"`
}

// SnapshotRequest names a new snapshot.
type SnapshotRequest struct {
	Name string `json:"name,omitempty" validate:"omitempty,max=63,dnslabel"`
}

// ForkRequest asks for Count new sandboxes from one running sandbox.
type ForkRequest struct {
	// Count is how many clones; default 1.
	Count int `json:"count,omitempty" validate:"gte=0,lte=16"`
	// Name, when set, names the clones Name-1 ... Name-Count.
	Name string `json:"name,omitempty" validate:"omitempty,max=60,dnslabel"`
	// Labels are added to the source's.
	Labels map[string]string `json:"labels,omitempty" validate:"max=32,dive,keys,labelkey,endkeys,max=256"`
	// TTLSeconds deletes each clone that long after it is made.
	TTLSeconds int64 `json:"ttl_seconds,omitempty" validate:"gte=0,lte=2592000"`
	// Volumes the clones attach; nil: the source's (a read-write one
	// the source still holds is then refused: name another, or attach
	// it read-only).
	Volumes []VolumeMount `json:"volumes,omitempty" validate:"max=8,dive"`
}

// MaxFork bounds ForkRequest.Count.
const MaxFork = 16

// SnapshotIDPrefix starts every snapshot ID.
const SnapshotIDPrefix = "snap_"

// NewSnapshotID returns a new random snapshot ID.
func NewSnapshotID() string {
	return SnapshotIDPrefix + strings.ToLower(ulid.MustNew(ulid.Now(), rand.Reader).String())
}

// ValidSnapshotID reports whether id has the shape NewSnapshotID produces.
func ValidSnapshotID(id string) bool {
	if !strings.HasPrefix(id, SnapshotIDPrefix) || len(id) != len(SnapshotIDPrefix)+26 {
		return false
	}
	_, err := ulid.ParseStrict(strings.ToUpper(id[len(SnapshotIDPrefix):]))
	return err == nil
}
