package move

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/sandbox"
)

const id = "sbx_01m8ka6npde8xkm1x1xncdtwqe"

// target is a Target on a directory, which records what it was asked.
type target struct {
	dir     string
	checked *Check
	adopted *Adoption
	dropped bool
	refuse  error
	// unexpected: the store does not say the files are coming.
	unexpected error
}

func (t *target) Check(ctx context.Context, id string, c Check) (Ready, error) {
	t.checked = &c
	if t.refuse != nil {
		return Ready{}, t.refuse
	}
	return Ready{StateDir: "/there/m/" + id}, nil
}
func (t *target) FilesDir(id string, stopped bool) string {
	if stopped {
		return filepath.Join(t.dir, "m", id)
	}
	return filepath.Join(t.dir, id)
}
func (t *target) IncomingDir(id string) string { return filepath.Join(t.dir, ".incoming-"+id) }
func (t *target) Adopt(ctx context.Context, id string, a Adoption) (*sandbox.Sandbox, error) {
	t.adopted = &a
	return &sandbox.Sandbox{ID: id, State: sandbox.StateRunning}, nil
}
func (t *target) Receiving(ctx context.Context, id string) error { return t.unexpected }
func (t *target) VolumeIncoming(ctx context.Context, id, vol string) (string, error) {
	return filepath.Join(t.dir, "volumes", ".incoming-"+vol), t.unexpected
}
func (t *target) VolumeReceived(vol, in string) error {
	defer os.RemoveAll(in)
	ents, err := os.ReadDir(in)
	for _, e := range ents {
		if err == nil {
			err = os.Rename(filepath.Join(in, e.Name()), filepath.Join(t.dir, "volumes", e.Name()))
		}
	}
	return err
}
func (t *target) Drop(ctx context.Context, id string) error {
	t.dropped = true
	return os.RemoveAll(t.FilesDir(id, false))
}

func serve(t *testing.T, tg *target) (*Client, Host) {
	t.Helper()
	srv := httptest.NewTLSServer(NewReceiver(tg))
	t.Cleanup(srv.Close)
	return &Client{hc: srv.Client(), stall: time.Minute}, Host{Name: "b", Address: srv.URL}
}

func TestMove(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	files := map[string]string{"memory": strings.Repeat("m", 1<<20), "disk0.qcow2": "disk", "snapshot.json": "{}"}
	for n, c := range files {
		os.WriteFile(filepath.Join(src, n), []byte(c), 0o600)
	}
	tg := &target{dir: filepath.Join(t.TempDir(), "hibernated")} // (made by the first move)
	c, h := serve(t, tg)
	ready, err := c.Check(ctx, h, id, Check{Image: "/img", Manifest: "ab", Size: sandbox.Resources{VCPUs: 1}})
	if err != nil || ready.StateDir != "/there/m/"+id || tg.checked.Image != "/img" || tg.checked.Size.VCPUs != 1 {
		t.Fatalf("check: %+v %v (asked %+v)", ready, err, tg.checked)
	}
	if err := c.Send(ctx, h, id, src, false, nil); err != nil {
		t.Fatal(err)
	}
	for n, want := range files {
		if got, err := os.ReadFile(filepath.Join(tg.FilesDir(id, false), n)); err != nil || string(got) != want {
			t.Fatalf("%s on the target: %d bytes, %v", n, len(got), err)
		}
	}
	if _, err := os.Stat(tg.IncomingDir(id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the incoming directory stays: %v", err)
	}
	// The same files again: what an earlier send left is dropped first
	// (the target's Drop refuses when the sandbox is its own).
	if err := c.Send(ctx, h, id, src, false, nil); err != nil || !tg.dropped {
		t.Fatalf("a second send: %v (dropped first: %v)", err, tg.dropped)
	}
	tg.dropped = false
	sb, err := c.Adopt(ctx, h, id, Adoption{Resume: true, Paused: true})
	if err != nil || sb.ID != id || tg.adopted == nil || !tg.adopted.Resume || !tg.adopted.Paused {
		t.Fatalf("adopt: %+v %v (asked %+v)", sb, err, tg.adopted)
	}
	if err := c.Drop(ctx, h, id); err != nil || !tg.dropped {
		t.Fatalf("drop: %v", err)
	}
	// The target's refusal comes back as its kind, with its words.
	tg.refuse = sandbox.Errorf(sandbox.ErrState, "", "host b does not have the image build /img")
	if _, err := c.Check(ctx, h, id, Check{}); !errors.Is(err, sandbox.ErrState) || !strings.Contains(err.Error(), "does not have the image build") {
		t.Fatalf("a refused check: %v", err)
	}
	// Files the store does not say are coming: refused, nothing written.
	tg.refuse, tg.unexpected = nil, sandbox.Errorf(sandbox.ErrState, "", "not being moved here")
	if err := c.Send(ctx, h, "sbx_01m8ka6npde8xkm1x1xncdtwqh", src, false, nil); !errors.Is(err, sandbox.ErrState) {
		t.Fatalf("files not expected: %v", err)
	}
	if _, err := os.Stat(tg.FilesDir("sbx_01m8ka6npde8xkm1x1xncdtwqh", false)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("files not expected were written: %v", err)
	}
	tg.unexpected = nil
	// A stopped sandbox's machine directory: its subdirectories go, what
	// skip names, sockets and links do not.
	const other = "sbx_01m8ka6npde8xkm1x1xncdtwqf"
	os.MkdirAll(filepath.Join(src, "disk", "deeper"), 0o700)
	os.WriteFile(filepath.Join(src, "disk", "deeper", "f"), []byte("deep"), 0o600)
	os.WriteFile(filepath.Join(src, "qemu.pid"), []byte("1"), 0o600)
	os.Symlink("/etc/passwd", filepath.Join(src, "link"))
	if err := c.Send(ctx, h, other, src, true, func(rel string) bool { return rel == "qemu.pid" }); err != nil {
		t.Fatal(err)
	}
	m := tg.FilesDir(other, true)
	if b, err := os.ReadFile(filepath.Join(m, "disk", "deeper", "f")); err != nil || string(b) != "deep" {
		t.Fatalf("a nested file: %q %v", b, err)
	}
	for _, n := range []string{"qemu.pid", "link"} {
		if _, err := os.Lstat(filepath.Join(m, n)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s went: %v", n, err)
		}
	}
	// Too deep: refused at the source.
	os.MkdirAll(filepath.Join(src, "a", "b", "c"), 0o700)
	os.WriteFile(filepath.Join(src, "a", "b", "c", "d"), nil, 0o600)
	if err := c.Send(ctx, h, "sbx_01m8ka6npde8xkm1x1xncdtwqg", src, true, nil); err == nil {
		t.Fatal("a file four deep went")
	}
}

// TestSendVolume: a volume's files (those skip does not name) reach the
// target's volume directory through its incoming one; a volume the target
// does not expect is refused, and nothing of it is written.
func TestSendVolume(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	const vol = "vol_01m8ka6npde8xkm1x1xncdtwqe"
	files := map[string]string{vol + ".qcow2": strings.Repeat("v", 1<<20), vol + ".1.qcow2": "layer"}
	for n, c := range files {
		os.WriteFile(filepath.Join(src, n), []byte(c), 0o600)
	}
	os.WriteFile(filepath.Join(src, "vol_other.qcow2"), []byte("not this one"), 0o600)
	tg := &target{dir: t.TempDir()}
	c, h := serve(t, tg)
	mine := func(rel string) bool { return !strings.HasPrefix(rel, vol+".") }
	if err := c.SendVolume(ctx, h, id, vol, src, mine); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(tg.dir, "volumes"))
	if len(ents) != len(files) {
		t.Fatalf("on the target: %v", ents)
	}
	for n, want := range files {
		if got, err := os.ReadFile(filepath.Join(tg.dir, "volumes", n)); err != nil || string(got) != want {
			t.Fatalf("%s on the target: %d bytes, %v", n, len(got), err)
		}
	}
	tg.unexpected = sandbox.Errorf(sandbox.ErrState, "", "does not move here")
	os.RemoveAll(filepath.Join(tg.dir, "volumes"))
	if err := c.SendVolume(ctx, h, id, vol, src, mine); !errors.Is(err, sandbox.ErrState) {
		t.Fatalf("a volume not expected: %v", err)
	}
	if _, err := os.Stat(filepath.Join(tg.dir, "volumes")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a volume not expected was written: %v", err)
	}
	if err := c.SendVolume(ctx, h, id, "../x", src, mine); err == nil {
		t.Fatal("a volume named ../x went")
	}
}

// TestReceiveRefuses: what the target takes from another host is bounded
// and checked, and a refused stream leaves nothing.
func TestReceiveRefuses(t *testing.T) {
	type entry struct {
		name string
		kind byte
		body string
	}
	stream := func(es ...entry) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, e := range es {
			tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: e.kind, Size: int64(len(e.body)), Mode: 0o600, Linkname: "/etc/passwd"})
			tw.Write([]byte(e.body))
		}
		tw.Close()
		return b.Bytes()
	}
	many := make([]entry, maxFiles+1)
	for i := range many {
		many[i] = entry{name: "f" + strings.Repeat("x", i%60) + string(rune('a'+i%26)) + string(rune('a'+i/26)), kind: tar.TypeReg, body: "x"}
	}
	for _, c := range []struct {
		name  string
		body  []byte
		bytes string
		want  error
	}{
		{"a path", stream(entry{"../escape", tar.TypeReg, "x"}), "1", sandbox.ErrInvalid},
		{"too deep", stream(entry{"a/b/c/d", tar.TypeReg, "x"}), "1", sandbox.ErrInvalid},
		{"an absolute path", stream(entry{"/etc/x", tar.TypeReg, "x"}), "1", sandbox.ErrInvalid},
		{"a dot in a path", stream(entry{"a/../../x", tar.TypeReg, "x"}), "1", sandbox.ErrInvalid},
		{"a dot file", stream(entry{".hidden", tar.TypeReg, "x"}), "1", sandbox.ErrInvalid},
		{"a symlink", stream(entry{"memory", tar.TypeSymlink, ""}), "1", sandbox.ErrInvalid},
		{"a directory", stream(entry{"memory", tar.TypeDir, ""}), "1", sandbox.ErrInvalid},
		{"more than announced", stream(entry{"memory", tar.TypeReg, "12345"}), "4", sandbox.ErrTooLarge},
		{"too many files", stream(many...), "1000", sandbox.ErrTooLarge},
		{"no size", stream(entry{"memory", tar.TypeReg, "x"}), "", sandbox.ErrInvalid},
		{"cut short", stream(entry{"memory", tar.TypeReg, "12345"}, entry{"disk", tar.TypeReg, "678"})[:1024], "8", sandbox.ErrInvalid},
		{"less than announced", stream(entry{"memory", tar.TypeReg, "12345"}), "6", sandbox.ErrInvalid},
	} {
		t.Run(c.name, func(t *testing.T) {
			tg := &target{dir: t.TempDir()}
			srv := httptest.NewServer(NewReceiver(tg))
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodPut, srv.URL+Prefix+id+"/files?bytes="+c.bytes, bytes.NewReader(c.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			err = readError("b", resp)
			resp.Body.Close()
			if resp.StatusCode < 400 || !errors.Is(err, c.want) {
				t.Fatalf("%s: %v, want %v", resp.Status, err, c.want)
			}
			if ents, _ := os.ReadDir(tg.dir); len(ents) != 0 {
				t.Fatalf("left on the target: %v", ents)
			}
		})
	}
}

// TestReceiveStalled: a sender that stops sending is cut, and nothing of
// its files stays.
func TestReceiveStalled(t *testing.T) {
	tg := &target{dir: t.TempDir()}
	rv := NewReceiver(tg)
	rv.Idle = 200 * time.Millisecond
	srv := httptest.NewServer(rv)
	defer srv.Close()
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() {
		tw := tar.NewWriter(pw)
		tw.WriteHeader(&tar.Header{Name: "memory", Typeflag: tar.TypeReg, Size: 1 << 20, Mode: 0o600})
		tw.Write(make([]byte, 1000)) // (then nothing)
	}()
	req, _ := http.NewRequest(http.MethodPut, srv.URL+Prefix+id+"/files?bytes=1048576", pr)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("a stalled stream: %s", resp.Status)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a stalled stream was cut after %v", d)
	}
	if ents, _ := os.ReadDir(tg.dir); len(ents) != 0 {
		t.Fatalf("left on the target: %v", ents)
	}
}

// TestSendStalled: a target that stops reading the files is cut, rather
// than holding the source (and its sandbox) for good.
func TestSendStalled(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "memory"), make([]byte, 32<<20), 0o600)
	done := make(chan struct{})
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-done // (reads nothing)
	}))
	defer srv.Close()
	defer close(done)
	c := &Client{hc: srv.Client(), stall: 300 * time.Millisecond}
	start := time.Now()
	err := c.Send(context.Background(), Host{Name: "b", Address: srv.URL}, id, src, false, nil)
	if err == nil || !strings.Contains(err.Error(), "cannot be reached") {
		t.Fatalf("a send to a target that reads nothing: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("cut after %v", d)
	}
}
