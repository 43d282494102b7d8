package volume

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/harebox/harebox/sandbox"
)

// TestReceived: a volume's files, received whole, are put in place only
// if every file is its own and its first file is among them; otherwise
// nothing of them stays.
func TestReceived(t *testing.T) {
	const id = "vol_01m8ka6npde8xkm1x1xncdtwqe"
	s := New(Options{Dir: t.TempDir()})
	in := func(names ...string) string {
		d := filepath.Join(s.o.Dir, incoming+id)
		os.MkdirAll(d, 0o700)
		for _, n := range names {
			os.WriteFile(filepath.Join(d, n), []byte(n), 0o600)
		}
		return d
	}
	for _, c := range []struct {
		what  string
		names []string
	}{
		{"another volume's file", []string{id + ".qcow2", "vol_01m8ka6npde8xkm1x1xncdtwqf.qcow2"}},
		{"a file of another kind", []string{id + ".qcow2", id + ".key"}},
		{"no first file", []string{id + ".1.qcow2"}},
	} {
		d := in(c.names...)
		if err := s.Received(id, d); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("%s: %v", c.what, err)
		}
		if ents, _ := os.ReadDir(s.o.Dir); len(ents) != 0 {
			t.Fatalf("%s: left %v", c.what, ents)
		}
	}
	if err := s.Received(id, in(id+".qcow2", id+".1.qcow2")); err != nil {
		t.Fatal(err)
	}
	if got := s.files(id); len(got) != 2 {
		t.Fatalf("in place: %v", got)
	}
}
