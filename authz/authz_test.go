package authz

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/harebox/harebox/sandbox"
)

func TestDecide(t *testing.T) {
	key := Principal{AccountID: "acc_a", KeyID: "key_1", Scope: Scope{
		Actions: []string{"sandboxes:read", "exec"}, Projects: []string{"prj_web"}, Labels: map[string]string{"team": "red"},
	}}
	box := Target{AccountID: "acc_a", ProjectID: "prj_web", SandboxID: "sbx_1", Labels: map[string]string{"team": "red", "x": "y"}}
	if err := Decide(key, "getSandbox", box); err != nil {
		t.Fatalf("allowed call refused: %v", err)
	}
	if err := Decide(key, "execStream", box); err != nil {
		t.Fatalf("the exec group: %v", err)
	}
	for name, c := range map[string]struct {
		action string
		t      Target
		kind   error
	}{
		"action":                                {"writeFile", box, sandbox.ErrForbidden},
		"account":                               {"getSandbox", Target{AccountID: "acc_b", ProjectID: "prj_web", SandboxID: "sbx_1", Labels: box.Labels}, sandbox.ErrNotFound},
		"project":                               {"getSandbox", Target{AccountID: "acc_a", ProjectID: "prj_db", SandboxID: "sbx_1", Labels: box.Labels}, sandbox.ErrNotFound},
		"label":                                 {"getSandbox", Target{AccountID: "acc_a", ProjectID: "prj_web", SandboxID: "sbx_1"}, sandbox.ErrNotFound},
		"account operations are the operator's": {"createAccount", Target{}, sandbox.ErrForbidden},
	} {
		if err := Decide(key, c.action, c.t); !errors.Is(err, c.kind) {
			t.Errorf("%s: %v, want %v", name, err, c.kind)
		}
	}
	if err := Decide(Operator, "deleteAccount", Target{AccountID: "acc_z"}); err != nil {
		t.Errorf("the operator: %v", err)
	}
}

func TestScopeValidateAndAddr(t *testing.T) {
	bad := map[string]Scope{
		"scope.actions[0]":   {Actions: []string{"rm -rf"}},
		"scope.sandboxes[0]": {Sandboxes: []string{"sbx_nope"}},
		"scope.cidrs[0]":     {CIDRs: []string{"10.0.0.0/33"}},
		"scope.rate":         {Rate: &Rate{PerSecond: 0, Burst: 1}},
	}
	for field, s := range bad {
		if err := s.Validate(); !errors.Is(err, sandbox.ErrInvalid) || sandbox.FieldOf(err) != field {
			t.Errorf("%s: %v (field %q)", field, err, sandbox.FieldOf(err))
		}
	}
	s := Scope{Labels: map[string]string{"bad key!": "x"}}
	if err := s.Validate(); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("bad label key: %v", err)
	}
	s = Scope{CIDRs: []string{"10.0.0.0/8"}}
	if !s.AllowsAddr(netip.MustParseAddr("10.1.2.3"), true) || s.AllowsAddr(netip.MustParseAddr("11.1.2.3"), true) || s.AllowsAddr(netip.Addr{}, false) {
		t.Error("AllowsAddr")
	}
	if !(&Scope{}).AllowsAddr(netip.Addr{}, false) {
		t.Error("a scope without CIDRs refused an unknown address")
	}
}

func TestWithin(t *testing.T) {
	now := time.Now()
	parent := Scope{Actions: []string{"exec"}, CIDRs: []string{"10.0.0.0/8"}}
	if err := (&Scope{Actions: []string{"execStream"}, CIDRs: []string{"10.1.0.0/16"}}).Within(&parent, now, now.Add(time.Hour)); err != nil {
		t.Errorf("narrower: %v", err)
	}
	if err := (&Scope{Actions: []string{"exec"}, CIDRs: []string{"10.0.0.0/7"}}).Within(&parent, time.Time{}, time.Time{}); sandbox.FieldOf(err) != "scope.cidrs" {
		t.Errorf("a shorter prefix: %v", err)
	}
	if err := (&Scope{}).Within(&Scope{}, time.Time{}, now); sandbox.FieldOf(err) != "expires_at" {
		t.Errorf("no expiry under an expiring parent: %v", err)
	}
}
