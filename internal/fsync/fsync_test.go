package fsync

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Dir(dir); err != nil {
		t.Fatalf("a directory: %v", err)
	}
	if err := Dir(filepath.Join(dir, "none")); !os.IsNotExist(err) {
		t.Fatalf("a missing directory: %v", err)
	}
}
