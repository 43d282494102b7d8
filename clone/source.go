package clone

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/guestenv"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// What a clone inherits from its source: a snapshot's record keeps it
// (Record), a create from the snapshot takes it as its request's
// defaults (Snapshots.Open), and a fork's clones as their requests
// (ForkRequest).

// Record is the record (not stored) of snapshot id of sandbox rec, taken
// into dir: policy is rec's firewall policy as the record keeps it.
func Record(rec *store.Sandbox, id, name, dir string, policy json.RawMessage) *store.Snapshot {
	s := &store.Snapshot{
		Snapshot: sandbox.Snapshot{
			ID: id, Name: name, AccountID: rec.AccountID, ProjectID: rec.ProjectID, SandboxID: rec.ID,
			Image: rec.Image, Size: rec.Size, Labels: rec.Labels, Bytes: monitor.DiskUse(dir), CreatedAt: time.Now().UTC(),
		},
		Dir: dir, ImageDir: rec.ImageDir,
		Source: store.SnapshotSource{
			FleetID: rec.FleetID, ThirdParty: rec.ThirdParty, NoEnv: rec.NoEnv, Monitoring: rec.Monitoring,
			Policy: policy, Mesh: rec.MeshAddress != "", Volumes: rec.Volumes, Site: cluster.Asked(rec),
		},
	}
	if rec.EnvironmentID != "" {
		if v, err := guestenv.Version(rec); err == nil {
			s.Source.Environment = rec.EnvironmentID + "@" + strconv.Itoa(v)
		}
	}
	return s
}

// ForkRequest is the create of clone i (from 0) of a fork req, from its
// snapshot s; operator: the caller is the operator, whose clones go to
// the source's account.
func ForkRequest(s *store.Snapshot, req sandbox.ForkRequest, i int, operator bool) sandbox.CreateRequest {
	creq := sandbox.CreateRequest{
		Project: s.ProjectID, Fleet: s.Source.FleetID, Environment: s.Source.Environment,
		ThirdParty: s.Source.ThirdParty, NoEnv: s.Source.NoEnv, Firewall: s.Source.Policy,
		Monitoring: &s.Source.Monitoring, TTLSeconds: req.TTLSeconds, Labels: mergeLabels(s.Labels, req.Labels),
		Site: s.Source.Site.Name, Country: s.Source.Site.Country,
	}
	if creq.NoEnv {
		creq.Environment = ""
	}
	if s.Source.Mesh {
		// (Each clone gets its own address and name.)
		creq.Mesh = &s.Source.Mesh
	}
	if operator {
		creq.AccountID = s.AccountID
	}
	if req.Name != "" {
		creq.Name = fmt.Sprintf("%s-%d", req.Name, i+1)
	}
	creq.Volumes = s.Source.Volumes
	if req.Volumes != nil {
		creq.Volumes = req.Volumes
	}
	return creq
}

func mergeLabels(a, b map[string]string) map[string]string {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := make(map[string]string, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}
