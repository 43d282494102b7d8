package kmod

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseList(t *testing.T) {
	in := "# virtio first\n/lib/modules/6.1/virtio.ko\n\n  /lib/modules/6.1/virtio_ring.ko.xz  \n#/off.ko\nbutton.ko\n"
	got, err := ParseList(strings.NewReader(in))
	want := []string{"/lib/modules/6.1/virtio.ko", "/lib/modules/6.1/virtio_ring.ko.xz", "button.ko"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, %v", got, err)
	}
}

// Stage copies what the list names, in its order, and lists the copies;
// two modules of one name stay two files.
func TestStage(t *testing.T) {
	src := t.TempDir()
	var list strings.Builder
	for i, p := range []string{"a/scsi_mod.ko", "b/sd_mod.ko", "c/sd_mod.ko"} {
		full := filepath.Join(src, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte{byte(i)}, 0o644); err != nil {
			t.Fatal(err)
		}
		list.WriteString(full + "\n")
	}
	listPath := filepath.Join(src, "modules.ondemand")
	os.WriteFile(listPath, []byte("# on demand\n"+list.String()), 0o644)
	run := t.TempDir()
	dir, out := filepath.Join(run, "modules"), filepath.Join(run, "modules.ondemand")
	if err := Stage(listPath, dir, out); err != nil {
		t.Fatal(err)
	}
	staged, err := readList(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(staged) != 3 {
		t.Fatalf("staged list %v", staged)
	}
	for i, p := range staged {
		if filepath.Dir(p) != dir {
			t.Errorf("%s is not in %s", p, dir)
		}
		b, err := os.ReadFile(p)
		if err != nil || len(b) != 1 || b[0] != byte(i) {
			t.Errorf("%s: %v %v, want the %dth module's bytes", p, b, err, i)
		}
	}
	// No list (an image built without one): nothing staged, no error.
	if err := Stage(filepath.Join(src, "none"), filepath.Join(run, "x"), filepath.Join(run, "y")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(run, "y")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a list was written for no list: %v", err)
	}
	// A listed module that is gone is an error, not a short list.
	os.Remove(filepath.Join(src, "b/sd_mod.ko"))
	if err := Stage(listPath, filepath.Join(run, "m2"), filepath.Join(run, "l2")); err == nil {
		t.Error("a missing module staged without an error")
	}
}

// A missing list is ErrNoList; a list naming a missing module is another
// error (the caller must not take it for "nothing to load").
func TestLoadListErrors(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := LoadList(filepath.Join(dir, "none")); !errors.Is(err, ErrNoList) {
		t.Fatalf("no list: %v", err)
	}
	list := filepath.Join(dir, "list")
	os.WriteFile(list, []byte(filepath.Join(dir, "gone.ko")+"\n"), 0o644)
	loaded, total, err := LoadList(list)
	if err == nil || errors.Is(err, ErrNoList) || !errors.Is(err, os.ErrNotExist) || loaded != 0 || total != 1 {
		t.Fatalf("a missing module: %d of %d, %v", loaded, total, err)
	}
}
