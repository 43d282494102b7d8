package firewall

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/harebox/harebox/model"
)

func TestStoredAndRequested(t *testing.T) {
	if p, err := Stored(nil); err != nil || p.DefaultOutbound != Allow {
		t.Errorf("a record without a policy: %+v %v, want the default", p, err)
	}
	deny := DenyAll()
	raw, err := Requested(nil, deny)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := Stored(raw); err != nil || p.DefaultOutbound != Deny {
		t.Errorf("the engine's default, stored: %s -> %+v %v", raw, p, err)
	}
	if raw, err := Requested(nil, nil); raw != nil || err != nil {
		t.Errorf("neither: %s %v", raw, err)
	}
	raw, err = Requested(json.RawMessage(`{"default_outbound":"deny","outbound":[{"action":"allow","cidrs":["10.0.0.0/99"]}]}`), nil)
	if !errors.Is(err, model.ErrInvalid) || raw != nil {
		t.Fatalf("a bad CIDR: %s %v", raw, err)
	}
	if f := model.FieldOf(err); len(f) <= len("firewall.") || f[:9] != "firewall." {
		t.Errorf("a bad CIDR names field %q, want one under firewall.", f)
	}
	if _, err := Requested(json.RawMessage(`[1]`), nil); !errors.Is(err, model.ErrInvalid) || model.FieldOf(err) != "firewall" {
		t.Errorf("not a policy: %v (field %q)", err, model.FieldOf(err))
	}
}
