package mounts

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A tmpfs mounted two levels down, in a directory whose name mountinfo
// escapes, is detached and the whole tree removed.
func TestRemoveAllDetaches(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount)")
	}
	dir := t.TempDir()
	mp := filepath.Join(dir, "a b", "staging")
	if err := os.MkdirAll(mp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mp, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mp, syscall.MNT_DETACH) })
	os.WriteFile(filepath.Join(mp, "memory"), []byte("guest memory"), 0o600)
	if got, err := Under(dir); err != nil || len(got) != 1 || got[0] != mp {
		t.Fatalf("mounts under %s: %q %v", dir, got, err)
	}
	if err := RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", dir, err)
	}
}
