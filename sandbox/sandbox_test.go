package sandbox

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	good := []struct {
		req  CreateRequest
		want Resources
	}{
		{CreateRequest{}, Presets["small"]},
		{CreateRequest{Size: Size{Preset: "large"}}, Presets["large"]},
		{CreateRequest{Size: Size{VCPUs: 2, MemoryMB: 1024}}, Resources{2, 1024, 5}},
		{CreateRequest{Name: "untrusted", TTLSeconds: 900, Labels: map[string]string{"team/a": "x"}}, Presets["small"]},
	}
	for _, g := range good {
		got, img, err := g.req.Resolve()
		if err != nil || got != g.want || img != DefaultImage {
			t.Errorf("%+v: got %+v %q %v, want %+v", g.req, got, img, err, g.want)
		}
	}
	bad := []struct {
		req   CreateRequest
		field string
	}{
		{CreateRequest{Size: Size{Preset: "huge"}}, "size.preset"},
		{CreateRequest{Size: Size{VCPUs: 999, MemoryMB: 512}}, "size.vcpus"},
		{CreateRequest{Size: Size{VCPUs: 1}}, "size"},
		{CreateRequest{Size: Size{Preset: "small", VCPUs: 2}}, "size"},
		{CreateRequest{TTLSeconds: -1}, "ttl_seconds"},
		{CreateRequest{Name: "Bad Name"}, "name"},
		{CreateRequest{Image: "../etc"}, "image"},
		{CreateRequest{Env: map[string]string{"1BAD": "x"}}, "env[1BAD]"},
		{CreateRequest{Labels: map[string]string{"": "x"}}, "labels[]"},
	}
	for _, b := range bad {
		_, _, err := b.req.Resolve()
		if !errors.Is(err, ErrInvalid) || FieldOf(err) != b.field {
			t.Errorf("%+v: got %v (field %q), want ErrInvalid on %q", b.req, err, FieldOf(err), b.field)
		}
	}
}

func TestTransitions(t *testing.T) {
	ok := [][2]State{{StateCreating, StateRunning}, {StateRunning, StatePaused}, {StatePaused, StateRunning}, {StateRunning, StateStopped}, {StateStopped, StateDeleted}}
	for _, p := range ok {
		if err := CanTransition(p[0], p[1]); err != nil {
			t.Errorf("%s -> %s: %v", p[0], p[1], err)
		}
	}
	bad := [][2]State{{StateStopped, StateRunning}, {StateDeleted, StateRunning}, {StatePaused, StatePaused}, {StateCreating, StatePaused}}
	for _, p := range bad {
		err := CanTransition(p[0], p[1])
		if !errors.Is(err, ErrState) || !strings.Contains(err.Error(), string(p[0])) {
			t.Errorf("%s -> %s: got %v, want a clear ErrState", p[0], p[1], err)
		}
	}
}

func TestIDs(t *testing.T) {
	a, b := NewID(), NewID()
	if !ValidID(a) || !ValidID(b) || a == b || !strings.HasPrefix(a, "sbx_") {
		t.Fatalf("bad ids %q %q", a, b)
	}
	if ValidID("sbx_nope") || ValidID("xyz_"+a[4:]) || ValidID(a+"0") {
		t.Fatal("accepted a malformed id")
	}
}

// TestCodeLanguages: the requests' validate tags take every language of
// CodeLanguages, and no other.
func TestCodeLanguages(t *testing.T) {
	for _, l := range append(slices.Clone(CodeLanguages), "cobol") {
		want := l != "cobol"
		r := CodeRequest{Code: "1", Language: l}
		c := CodeContextRequest{Language: l}
		if got := r.Check() == nil; got != want {
			t.Errorf("a cell in %s: accepted %v, want %v", l, got, want)
		}
		if got := c.Check() == nil; got != want {
			t.Errorf("a context in %s: accepted %v, want %v", l, got, want)
		}
	}
}
