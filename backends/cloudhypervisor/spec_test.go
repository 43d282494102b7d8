package cloudhypervisor

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/harebox/harebox/hypervisor"
)

// The copy in testdata must be the shared spec, byte for byte, wherever a
// shared/specs directory sits (this workplace's, or one beside the repo).
func TestSpecCopyIsShared(t *testing.T) {
	name := filepath.Base(specFile)
	mine, err := os.ReadFile(specFile)
	if err != nil {
		t.Fatal(err)
	}
	compared := 0
	for _, dir := range []string{"/work/shared/specs", "../../../shared/specs"} {
		shared, err := os.ReadFile(filepath.Join(dir, name))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		compared++
		if !bytes.Equal(mine, shared) {
			t.Errorf("%s differs from %s: copy the shared spec into testdata/", specFile, filepath.Join(dir, name))
		}
	}
	if compared == 0 {
		t.Skip("no shared/specs directory here to compare testdata against")
	}
}

// schemaOf maps each Go type to the spec schema it stands for.
var schemaOf = map[reflect.Type]string{
	reflect.TypeFor[VmmPingResponse]():  "VmmPingResponse",
	reflect.TypeFor[VmInfo]():           "VmInfo",
	reflect.TypeFor[DeviceNode]():       "DeviceNode",
	reflect.TypeFor[VmConfig]():         "VmConfig",
	reflect.TypeFor[PayloadConfig]():    "PayloadConfig",
	reflect.TypeFor[CpusConfig]():       "CpusConfig",
	reflect.TypeFor[MemoryConfig]():     "MemoryConfig",
	reflect.TypeFor[DiskConfig]():       "DiskConfig",
	reflect.TypeFor[NetConfig]():        "NetConfig",
	reflect.TypeFor[RngConfig]():        "RngConfig",
	reflect.TypeFor[SerialConfig]():     "SerialConfig",
	reflect.TypeFor[ConsoleConfig]():    "ConsoleConfig",
	reflect.TypeFor[VsockConfig]():      "VsockConfig",
	reflect.TypeFor[LandlockConfig]():   "LandlockConfig",
	reflect.TypeFor[VmSnapshotConfig](): "VmSnapshotConfig",
	reflect.TypeFor[RestoreConfig]():    "RestoreConfig",
}

// Every field of the Go types is a property of its schema with the same
// JSON name and a matching type; required properties are not omitempty.
func TestTypesMatchSpec(t *testing.T) {
	doc, _, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	for typ, name := range schemaOf {
		ref := doc.Components.Schemas[name]
		if ref == nil {
			t.Errorf("%s: no schema %s", typ.Name(), name)
			continue
		}
		sch := ref.Value
		for i := range typ.NumField() {
			f := typ.Field(i)
			tag, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			prop := sch.Properties[tag]
			if prop == nil {
				t.Errorf("%s.%s: %s has no property %q", typ.Name(), f.Name, name, tag)
				continue
			}
			if err := kindMatches(f.Type, prop); err != "" {
				t.Errorf("%s.%s (%q): %s", typ.Name(), f.Name, tag, err)
			}
			required := false
			for _, r := range sch.Required {
				required = required || r == tag
			}
			if required && strings.Contains(opts, "omitempty") {
				t.Errorf("%s.%s: %q is required by the spec but omitempty", typ.Name(), f.Name, tag)
			}
		}
		for _, r := range sch.Required {
			if !hasJSONField(typ, r) {
				t.Errorf("%s: lacks required property %q of %s", typ.Name(), r, name)
			}
		}
	}
}

func hasJSONField(typ reflect.Type, name string) bool {
	for i := range typ.NumField() {
		if tag, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ","); tag == name {
			return true
		}
	}
	return false
}

// kindMatches compares a Go field type with a property; struct types
// must be the schema the property refers to.
func kindMatches(t reflect.Type, ref *openapi3.SchemaRef) string {
	s := ref.Value
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	typ := ""
	if s.Type != nil && len(*s.Type) > 0 {
		typ = (*s.Type)[0]
	}
	want := map[reflect.Kind]string{
		reflect.String: "string", reflect.Bool: "boolean", reflect.Int: "integer", reflect.Int64: "integer",
		reflect.Slice: "array", reflect.Struct: "object", reflect.Map: "object",
	}[t.Kind()]
	if typ != want {
		return "Go " + t.String() + " is not spec " + typ
	}
	switch {
	case t.Kind() == reflect.Int && s.Format == "int64":
		return "spec format int64 wants int64"
	case t.Kind() == reflect.Int64 && s.Format != "int64":
		return "int64 for spec format " + s.Format
	case t.Kind() == reflect.Slice:
		return kindMatches(t.Elem(), s.Items)
	}
	if name, ok := schemaOf[t]; ok && ref.Ref != "#/components/schemas/"+name {
		return "Go " + t.Name() + " stands for " + name + ", the spec refers to " + ref.Ref
	}
	return ""
}

// The VmConfig the backend builds is a valid VmConfig (the stub also
// checks every vm.create; this covers the Landlock and overlay variants).
func TestBuiltConfigMatchesSpec(t *testing.T) {
	doc, _, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	b := New(Config{})
	b.hp.lsm = filepath.Join(shortTempDir(t), "lsm")
	os.WriteFile(b.hp.lsm, []byte("capability,landlock,yama\n"), 0o600)
	p, err := newPaths("/var/lib/harebox/m1", "")
	if err != nil {
		t.Fatal(err)
	}
	spec := hypervisor.Spec{ID: "m1", VCPUs: 2, MemoryMB: 1024, Kernel: "/k", Initrd: "/i", StateDir: p.stateDir,
		Network: &hypervisor.Network{Tap: "t0", MAC: "52:54:00:00:00:01"}}
	disks := []DiskConfig{{Path: p.stateDir + "/disk-0.qcow2", ImageType: ImageTypeQcow2, BackingFiles: true}}
	rules := b.landlockRules(Version{Major: 53}, p, []string{"/images/base.raw"})
	cfg := buildVmConfig(spec, p, disks, rules)
	if !cfg.LandlockEnable || len(cfg.LandlockRules) != 2 || cfg.Payload.Cmdline != defaultCmdline || cfg.Vsock.Cid != 3 {
		t.Fatalf("config = %+v", cfg)
	}
	if r := b.landlockRules(Version{Major: 40}, p, nil); r != nil {
		t.Fatalf("landlock rules for v40: %v", r)
	}
	var v any
	raw, _ := json.Marshal(cfg)
	json.Unmarshal(raw, &v)
	if err := doc.Components.Schemas["VmConfig"].Value.VisitJSON(v); err != nil {
		t.Fatalf("built VmConfig does not match the spec: %v\n%s", err, raw)
	}
}

func TestRewriteConfig(t *testing.T) {
	src := `{"cpus":{"boot_vcpus":1,"max_vcpus":1},"memory":{"size":9007199254740993},
		"payload":{"kernel":"/k"},"vsock":{"cid":3,"socket":"/old/vsock.sock"},
		"serial":{"mode":"File","file":"/old/serial.log"},
		"disks":[{"path":"/old/disk-0.qcow2","image_type":"Qcow2","backing_files":true},{"path":"/ro.raw","readonly":true}],
		"net":[{"tap":"t-old","mac":"52:54:00:00:00:01","id":"_net2"}],
		"landlock_enable":true,"landlock_rules":[{"path":"/old","access":"rw"},{"path":"/base.raw","access":"r"}],
		"unknown_field":{"kept":true}}`
	decode := func() map[string]any {
		cfg, err := decodeNumbers([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	p, _ := newPaths("/new", "")
	rw := rewrite{oldStateDir: "/old", paths: p, disks: []string{"/new/disk-0.qcow2", "/ro.raw"},
		network: &hypervisor.Network{Tap: "t-new", MAC: "52:54:00:00:00:02"}, landlock: true}
	cfg := decode()
	if err := rewriteConfig(cfg, rw); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(cfg)
	for _, want := range []string{`"socket":"/new/vsock.sock"`, `"file":"/new/serial.log"`, `"path":"/new/disk-0.qcow2"`,
		`"tap":"t-new"`, `"id":"_net2"`, `{"access":"rw","path":"/new"}`, `{"access":"r","path":"/base.raw"}`,
		`"size":9007199254740993`, `"unknown_field":{"kept":true}`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("rewritten config lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), `"/old`) {
		t.Errorf("rewritten config still names the old state dir:\n%s", out)
	}

	// Landlock off on this host: the clone's config does not ask for it.
	cfg = decode()
	rw.landlock = false
	rewriteConfig(cfg, rw)
	if _, ok := cfg["landlock_enable"]; ok {
		t.Errorf("landlock_enable kept without Landlock: %v", cfg)
	}
	// A network mismatch is refused.
	cfg = decode()
	rw.network = nil
	if err := rewriteConfig(cfg, rw); err == nil {
		t.Error("clone without a network accepted for a snapshot with one")
	}
}
