package images

import "testing"

// TestBaseKey: the kept debootstrap tree is shared by builds of the same
// debootstrap inputs only (what an image adds after it is not one).
func TestBaseKey(t *testing.T) {
	key := func(name string, edit func(*Options)) string {
		t.Helper()
		o := Options{Name: name, AgentPath: "/x", OutDir: t.TempDir()}
		if err := o.setDefaults(); err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			edit(&o)
		}
		k, err := baseKey(&o)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	def := key(Default, nil)
	if ci := key(CodeInterpreter, nil); ci != def {
		t.Errorf("default and code-interpreter debootstrap differently: %s %s", def, ci)
	}
	for name, edit := range map[string]func(*Options){
		"packages": func(o *Options) { o.Packages = append(o.Packages[:len(o.Packages):len(o.Packages)], "vim") },
		"suite":    func(o *Options) { o.Suite = "trixie" },
		"mirror":   func(o *Options) { o.Mirror = "http://mirror.test/debian" },
	} {
		if key(Default, edit) == def {
			t.Errorf("another %s, the same tree", name)
		}
	}
}
