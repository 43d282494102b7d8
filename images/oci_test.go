package images

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type entry struct {
	name, link string
	typ        byte
	body       string
	size       int64 // header size when not len(body)
	mode       int64
}

func tarOf(t *testing.T, entries ...entry) *bytes.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.body))}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if e.size != 0 {
			h.Size = e.size
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.size == 0 && e.body != "" {
			tw.Write([]byte(e.body))
		}
	}
	// (An entry that claims more than it holds ends the stream early.)
	tw.Flush()
	return bytes.NewReader(buf.Bytes())
}

// TestUnpack: a layer's files, links, modes and owners land in the tree.
func TestUnpack(t *testing.T) {
	dir := t.TempDir()
	n, err := unpack(context.Background(), tarOf(t,
		entry{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "etc/hello", typ: tar.TypeReg, body: "hi\n"},
		entry{name: "./bin/tool", typ: tar.TypeReg, body: "#!/bin/sh\n", mode: 0o4755},
		entry{name: "bin/alias", typ: tar.TypeSymlink, link: "tool"},
		entry{name: "etc/abs", typ: tar.TypeSymlink, link: "/etc/hello"},
		entry{name: "etc/again", typ: tar.TypeLink, link: "etc/hello"},
		entry{name: "etc/hello", typ: tar.TypeReg, body: "replaced\n"},
	), dir, 1<<20, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(len("hi\n#!/bin/sh\nreplaced\n")) {
		t.Errorf("unpacked %d bytes", n)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "etc/hello")); string(b) != "replaced\n" {
		t.Errorf("etc/hello: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "etc/again")); string(b) != "hi\n" {
		t.Errorf("hard link: %q (a later file replaces the name, not the shared inode)", b)
	}
	if fi, err := os.Stat(filepath.Join(dir, "bin/tool")); err != nil || fi.Mode()&os.ModeSetuid == 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("bin/tool: %v %v", fi.Mode(), err)
	}
	if l, _ := os.Readlink(filepath.Join(dir, "etc/abs")); l != "/etc/hello" {
		t.Errorf("absolute symlink kept as the guest sees it: %q", l)
	}
	if l, _ := os.Readlink(filepath.Join(dir, "bin/alias")); l != "tool" {
		t.Errorf("symlink: %q", l)
	}
}

// TestUnpackHostile: a hostile layer is refused, naming its entry, and
// writes nothing outside the build directory.
func TestUnpackHostile(t *testing.T) {
	outside := t.TempDir()
	hostFile := filepath.Join(outside, "host-file")
	os.WriteFile(hostFile, []byte("host\n"), 0o644)
	for name, tc := range map[string]struct {
		entries []entry
		want    string
	}{
		"dot-dot":                            {[]entry{{name: "../../pwned", typ: tar.TypeReg, body: "x"}}, "climbs out"},
		"dot-dot inside":                     {[]entry{{name: "a/../../pwned", typ: tar.TypeReg, body: "x"}}, "climbs out"},
		"absolute link, then through it":     {[]entry{{name: "esc", typ: tar.TypeSymlink, link: outside}, {name: "esc/pwned", typ: tar.TypeReg, body: "x"}}, "esc/pwned"},
		"relative link out, then through it": {[]entry{{name: "esc", typ: tar.TypeSymlink, link: "../../../../../../" + outside}, {name: "esc/pwned", typ: tar.TypeReg, body: "x"}}, "esc/pwned"},
		"file over a link out":               {[]entry{{name: "f", typ: tar.TypeSymlink, link: hostFile}, {name: "f/x", typ: tar.TypeReg, body: "x"}}, "f/x"},
		"hard link out":                      {[]entry{{name: "hl", typ: tar.TypeLink, link: "../../" + hostFile}}, "climbs out"},
		"hard link via a link":               {[]entry{{name: "esc", typ: tar.TypeSymlink, link: outside}, {name: "hl", typ: tar.TypeLink, link: "esc/host-file"}}, "hl"},
		"character device":                   {[]entry{{name: "dev/mem", typ: tar.TypeChar}}, "device nodes"},
		"block device":                       {[]entry{{name: "sda", typ: tar.TypeBlock}}, "device nodes"},
		"fifo":                               {[]entry{{name: "p", typ: tar.TypeFifo}}, "FIFOs"},
		"huge file":                          {[]entry{{name: "big", typ: tar.TypeReg, size: 5 << 30}}, "over the"},
		"too much in all":                    {[]entry{{name: "a", typ: tar.TypeReg, body: strings.Repeat("a", 700)}, {name: "b", typ: tar.TypeReg, body: strings.Repeat("b", 700)}}, "more than"},
		"truncated":                          {[]entry{{name: "short", typ: tar.TypeReg, body: "", size: 500}}, "short"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "rootfs")
			os.Mkdir(dir, 0o755)
			_, err := unpack(context.Background(), tarOf(t, tc.entries...), dir, 1024, 1024, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Errorf("outside the build directory: %v", ents)
			}
			if b, _ := os.ReadFile(hostFile); string(b) != "host\n" {
				t.Errorf("the host's file changed: %q", b)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(filepath.Dir(dir)), "pwned")); err == nil {
				t.Error("wrote above the build directory")
			}
		})
	}
}

// TestOCIName: an image from an OCI image needs a name of its own.
func TestOCIName(t *testing.T) {
	for _, name := range []string{"", "default", "minimal", "Bad_Name", "../x"} {
		o := Options{Name: name, From: "oci:/nonexistent", AgentPath: "/bin/true", OutDir: t.TempDir()}
		if err := o.setDefaults(); err == nil {
			t.Errorf("name %q accepted", name)
		}
	}
	if _, _, err := OpenOCI(context.Background(), "tar:/x"); err == nil || !strings.Contains(err.Error(), "oci:DIR") {
		t.Errorf("unknown source kind: %v", err)
	}
	if _, _, err := OpenOCI(context.Background(), "oci:"+t.TempDir()); err == nil {
		t.Error("an empty directory opened as an OCI layout")
	}
}

// TestConfigureOCIRoot: the agent, the default user and identity files go
// into the tree; an image with systemd gets the agent's unit, enabled; an
// image whose /etc points out of the tree fails and writes nothing there.
func TestConfigureOCIRoot(t *testing.T) {
	agent := filepath.Join(t.TempDir(), "agent")
	os.WriteFile(agent, []byte("agent binary"), 0o755)
	o := &Options{AgentPath: agent, Hostname: "harebox"}

	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "lib/systemd"), 0o755)
	os.WriteFile(filepath.Join(root, "lib/systemd/systemd"), []byte("systemd"), 0o755)
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh"), 0o644)
	systemd, err := configureOCIRoot(context.Background(), o, root)
	if err != nil || !systemd {
		t.Fatalf("systemd %v, %v", systemd, err)
	}
	for rel, want := range map[string]string{
		"usr/local/bin/harebox-agent": "agent binary",
		"etc/passwd":                  "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:HareBox user:/home/user:/bin/sh\n",
		"etc/group":                   "user:x:1000:\n",
		"etc/hostname":                "harebox\n",
		"etc/machine-id":              "",
	} {
		if b, err := os.ReadFile(filepath.Join(root, rel)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v, want %q", rel, b, err, want)
		}
	}
	if l, err := os.Readlink(filepath.Join(root, "etc/systemd/system/multi-user.target.wants/harebox-agent.service")); err != nil || l != "/etc/systemd/system/harebox-agent.service" {
		t.Errorf("the agent's unit is not enabled: %q %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("/tmp: %v %v", fi, err)
	}

	// Without systemd: no unit (the agent is init, from the cmdline).
	plain := t.TempDir()
	if systemd, err := configureOCIRoot(context.Background(), o, plain); err != nil || systemd {
		t.Fatalf("systemd %v, %v", systemd, err)
	}
	if _, err := os.Stat(filepath.Join(plain, "etc/systemd")); err == nil {
		t.Error("a unit written into an image without systemd")
	}

	outside := t.TempDir()
	hostile := t.TempDir()
	os.Symlink(outside, filepath.Join(hostile, "etc"))
	if _, err := configureOCIRoot(context.Background(), o, hostile); err == nil {
		t.Fatal("an /etc that points out of the image was written through")
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("written outside the image: %v", ents)
	}
}
