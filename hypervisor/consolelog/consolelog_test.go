package consolelog

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAppendTail(t *testing.T) {
	id, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "serial.log")
	a, err := NewAppender(path, id.Recipient().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Tail(path, id, 100); err != nil || len(got) != 0 {
		t.Fatalf("missing log: %q %v", got, err)
	}
	for _, line := range []string{"boot\n", "canary-7e1f\n", "login: "} {
		if err := a.Append([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	raw, _ := os.ReadFile(path)
	if bytes.Contains(raw, []byte("canary-7e1f")) {
		t.Fatal("the console is stored in plain text")
	}
	got, err := Tail(path, id, 1<<20)
	if err != nil || string(got) != "boot\ncanary-7e1f\nlogin: " {
		t.Fatalf("tail: %q %v", got, err)
	}
	if got, _ := Tail(path, id, 7); string(got) != "login: " {
		t.Fatalf("short tail: %q", got)
	}
	other, _ := NewIdentity()
	if _, err := Tail(path, other, 100); err == nil {
		t.Fatal("read with another identity")
	}
	os.WriteFile(path, append(raw, 0, 0, 0x10), 0o600)
	if _, err := Tail(path, id, 100); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("cut log: %v, want ErrCorrupt", err)
	}
	if _, err := NewAppender(path, "age1nope", 0); err == nil {
		t.Fatal("a bad recipient was accepted")
	}
}

func TestBounded(t *testing.T) {
	id, _ := NewIdentity()
	path := filepath.Join(t.TempDir(), "serial.log")
	a, err := NewAppender(path, id.Recipient().String(), 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Repeat("x", 1000) + "\n"
	for range 200 {
		if err := a.Append([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	if fi, _ := os.Stat(path); fi.Size() > 64<<10 {
		t.Fatalf("log is %d bytes, bound 64 KiB", fi.Size())
	}
	if got, err := Tail(path, id, 1<<20); err != nil || !strings.HasSuffix(string(got), line) {
		t.Fatalf("tail after wrapping: %d bytes, %v", len(got), err)
	}
}
