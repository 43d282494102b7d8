package clone

import (
	"encoding/json"
	"testing"

	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// TestSource: a snapshot's record keeps what its clones inherit (place,
// env choices, monitoring, policy, the pinned environment version), and
// a fork's clones get it, with the fork's own labels, TTL and names; a
// source without env gives its clones no environment.
func TestSource(t *testing.T) {
	policy := json.RawMessage(`{"default_outbound":"deny"}`)
	rec := &store.Sandbox{
		Sandbox: sandbox.Sandbox{ID: "sbx_src", AccountID: "acc_a", ProjectID: "prj_a", FleetID: "flt_a", Image: "default",
			Size: sandbox.Presets["small"], Labels: map[string]string{"team": "red"}, ThirdParty: true, Monitoring: true},
		ImageDir:      "/images/default-1",
		EnvironmentID: "env_a",
		Extra:         map[string]json.RawMessage{"environment_version": json.RawMessage("3")},
	}
	s := Record(rec, "snap_1", "base", t.TempDir(), policy)
	if s.SandboxID != "sbx_src" || s.AccountID != "acc_a" || s.ImageDir != "/images/default-1" || s.Name != "base" {
		t.Errorf("record: %+v", s.Snapshot)
	}
	if src := s.Source; src.FleetID != "flt_a" || !src.ThirdParty || !src.Monitoring || src.Environment != "env_a@3" || string(src.Policy) != string(policy) {
		t.Errorf("source: %+v", src)
	}

	fork := sandbox.ForkRequest{Name: "job", Labels: map[string]string{"run": "7"}, TTLSeconds: 60}
	c := ForkRequest(s, fork, 1, false)
	if c.Name != "job-2" || c.Project != "prj_a" || c.Fleet != "flt_a" || c.Environment != "env_a@3" || !c.ThirdParty ||
		string(c.Firewall) != string(policy) || c.Monitoring == nil || !*c.Monitoring || c.TTLSeconds != 60 || c.AccountID != "" {
		t.Errorf("a clone's request: %+v", c)
	}
	if c.Labels["team"] != "red" || c.Labels["run"] != "7" || len(s.Labels) != 1 {
		t.Errorf("labels: the clone's %v, the snapshot's %v", c.Labels, s.Labels)
	}
	if c := ForkRequest(s, sandbox.ForkRequest{}, 0, true); c.AccountID != "acc_a" || c.Name != "" {
		t.Errorf("an operator's clone: %+v", c)
	}
	s.Source.NoEnv = true
	if c := ForkRequest(s, fork, 0, false); c.Environment != "" || !c.NoEnv {
		t.Errorf("a clone of a source without env: %+v", c)
	}
}
