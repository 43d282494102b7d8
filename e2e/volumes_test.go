package e2e_test

import (
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/harebox/harebox/hypervisor/hypervisortest"
	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/sandbox"

	_ "modernc.org/sqlite" // (the data directory's database, read by the checks)
)

// TestVolumes, on real VMs through the CLI: what sandbox A wrote to a
// volume is there, byte for byte, in sandbox B after A is deleted; a
// second writer is refused; a reader beside a running writer sees the
// volume as it was when it attached (what the writer had not synced
// too), and not what the writer writes after; a reader gets EROFS; a volume grows for the next sandbox; another
// project's volume is not found; the canary is in no host file in plain
// text, and after the volume is deleted its key and file are gone.
func TestVolumes(t *testing.T) {
	t.Parallel()
	s := testserver.Prepare(t)
	// (Creates restore the golden snapshot: their volumes are plugged
	// into a machine whose devices were fixed before.)
	cli := testserver.StartCLI(t, s, "hbvol", "--golden-snapshots")
	dataDir := cli.Srv.DataDir
	newBox := func(args ...string) sandbox.Sandbox {
		t.Helper()
		var b sandbox.Sandbox
		cli.OK("", &b, append([]string{"new", "--image", "minimal", "--ttl", "900"}, args...)...)
		cli.Made(b.ID)
		return b
	}
	sh := func(id, script string) (string, string, int) {
		t.Helper()
		return cli.Run("", "exec", id, "--user", "root", "--", "sh", "-c", script)
	}

	var vol struct {
		ID     string `json:"id"`
		SizeGB int    `json:"size_gb"`
	}
	cli.OK("", &vol, "volume", "create", "data", "--size", "1")
	canary := "volume-canary-" + strings.ToLower(vol.ID[len(vol.ID)-8:])

	a := newBox("--volume", "data:/mnt/data")
	if len(a.Volumes) != 1 || a.Volumes[0].Path != "/mnt/data" {
		t.Fatalf("sandbox A's volumes: %+v", a.Volumes)
	}
	// A fresh volume's root is the sandbox's user's.
	if o, _, _ := sh(a.ID, "stat -c %u /mnt/data"); o != "1000\n" {
		t.Errorf("the owner of a fresh volume's root: %q, want the sandbox's user (1000)", o)
	}
	if o, e, code := sh(a.ID, "echo "+canary+" > /mnt/data/canary && head -c 1048576 /dev/urandom > /mnt/data/blob && sha256sum /mnt/data/blob && sync"); code != 0 {
		t.Fatalf("write in A: %d %s %s", code, o, e)
	}
	sumA, _, _ := sh(a.ID, "sha256sum /mnt/data/blob")

	// One writer at a time.
	if _, e, code := cli.Run("", "new", "--image", "minimal", "--volume", "data:/mnt/data"); code == 0 || !strings.Contains(e, "attached to sandbox "+a.ID) {
		t.Errorf("a second writer: exit %d, %q; want refused, naming A", code, e)
	}
	// A reader beside it: A's filesystem is frozen (on its disk, what it
	// had not synced too) while A moves onto a new layer, and the reader
	// gets the one A left.
	if _, e, code := sh(a.ID, "echo late > /mnt/data/late"); code != 0 {
		t.Fatalf("write in A: %s", e)
	}
	ra := newBox("--volume", "data:/mnt/ro:ro")
	if o, _, _ := sh(ra.ID, "cat /mnt/ro/canary /mnt/ro/late; sha256sum /mnt/ro/blob"); !strings.Contains(o, canary+"\nlate\n") || !strings.Contains(o, strings.Fields(sumA)[0]) {
		t.Errorf("a reader beside A: %q; want the canary, what A had not synced, and the blob", o)
	}
	if _, e, code := sh(a.ID, "echo after > /mnt/data/after-reader && sync"); code != 0 {
		t.Errorf("A writing beside its reader: %s", e)
	}
	if o, _, code := sh(ra.ID, "ls /mnt/ro"); code != 0 || strings.Contains(o, "after-reader") {
		t.Errorf("the reader beside A: exit %d, %q; want what A wrote after it attached not there", code, o)
	}
	cli.OK("", nil, "delete", ra.ID)
	if _, e, code := cli.Run("", "volume", "delete", "data"); code == 0 || !strings.Contains(e, "attached") {
		t.Errorf("delete while attached: exit %d, %q; want refused", code, e)
	}
	cli.OK("", nil, "delete", a.ID)

	b := newBox("--volume", "data:/srv/data")
	if o, _, _ := sh(b.ID, "cat /srv/data/canary /srv/data/after-reader; sha256sum /srv/data/blob"); !strings.Contains(o, canary+"\nafter\n") || !strings.Contains(o, strings.Fields(sumA)[0]) {
		t.Errorf("in B: %q; want the canary, what A wrote beside its reader, and blob sum %s", o, sumA)
	}
	// A full volume is ENOSPC in the guest, and nothing else breaks.
	// (Filled by fallocate: the same full filesystem, without writing a
	// gigabyte under TCG.)
	if _, e, code := sh(b.ID, "fallocate -l $(( $(df -k /srv/data | tail -n 1 | awk '{print $4}') - 64 ))k /srv/data/fill && dd if=/dev/zero of=/srv/data/more bs=4k count=1024"); code == 0 || !strings.Contains(e, "No space left") {
		t.Errorf("filling the volume: exit %d, %q; want No space left on device", code, e)
	}
	if o, e, code := sh(b.ID, "echo fine > /tmp/after && cat /tmp/after && rm /srv/data/fill /srv/data/more && echo again > /srv/data/again && sync && cat /srv/data/again"); code != 0 || o != "fine\nagain\n" {
		t.Errorf("after ENOSPC: exit %d, %q %q", code, o, e)
	}
	// Stop and start: the volume is mounted again.
	cli.OK("", nil, "stop", b.ID)
	cli.OK("", nil, "start", b.ID)
	if o, _, _ := sh(b.ID, "cat /srv/data/again /srv/data/canary"); o != "again\n"+canary+"\n" {
		t.Errorf("after stop and start: %q", o)
	}
	cli.OK("", nil, "delete", b.ID)

	// Readers (r1 here, r3 below beside it), and they cannot write.
	r1 := newBox("--volume", "data:/mnt/ro:ro")
	if o, _, _ := sh(r1.ID, "cat /mnt/ro/canary"); !strings.Contains(o, canary) {
		t.Errorf("a reader reads %q", o)
	}
	if _, e, code := sh(r1.ID, "echo x > /mnt/ro/new"); code == 0 || !strings.Contains(e, "Read-only") {
		t.Errorf("a reader writing: exit %d, %q; want EROFS", code, e)
	}
	// A writer beside them writes to a layer of its own: they go on
	// seeing the volume as it was when they attached. A reader that
	// attaches after it has gone sees what it wrote.
	w := newBox("--volume", "data:/mnt/data")
	if _, e, code := sh(w.ID, "echo rewritten > /mnt/data/canary && sync"); code != 0 {
		t.Fatalf("the writer beside readers: %s", e)
	}
	if o, _, _ := sh(r1.ID, "cat /mnt/ro/canary"); o != canary+"\n" {
		t.Errorf("a reader while a writer rewrote the file: %q, want what it saw", o)
	}
	// A reader beside that writer (over r1's layer) sees what it wrote.
	r2 := newBox("--volume", "data:/mnt/ro:ro")
	if o, _, _ := sh(r2.ID, "cat /mnt/ro/canary"); o != "rewritten\n" {
		t.Errorf("a reader beside the writer: %q, want what it wrote", o)
	}
	if _, e, code := sh(w.ID, "echo rewritten-twice > /mnt/data/canary && sync"); code != 0 {
		t.Fatalf("the writer beside two readers: %s", e)
	}
	cli.OK("", nil, "delete", w.ID)
	r3 := newBox("--volume", "data:/mnt/ro:ro")
	if o, _, _ := sh(r3.ID, "cat /mnt/ro/canary"); o != "rewritten-twice\n" {
		t.Errorf("a reader after the writer: %q, want what it wrote", o)
	}
	if o, _, _ := sh(r1.ID, "cat /mnt/ro/canary"); o != canary+"\n" {
		t.Errorf("the first reader after the writer went: %q, want what it saw", o)
	}
	if o, _, _ := sh(r2.ID, "cat /mnt/ro/canary"); o != "rewritten\n" {
		t.Errorf("the reader beside the writer, after it went: %q, want what it saw", o)
	}
	for _, r := range []string{r1.ID, r2.ID, r3.ID} {
		cli.OK("", nil, "delete", r)
	}
	// Nothing holds it: its layers are folded into its first file.
	var layers struct {
		Layers int    `json:"layers"`
		Busy   string `json:"busy"`
	}
	cli.OK("", &layers, "volume", "get", "data")
	if layers.Layers != 0 || layers.Busy != "" {
		t.Errorf("after the last reader went: %+v, want its layers folded", layers)
	}

	// Grown while detached, the next writer has the room.
	cli.OK("", &vol, "volume", "resize", "data", "--size", "2")
	if vol.SizeGB != 2 {
		t.Errorf("resized to %d GB", vol.SizeGB)
	}
	g := newBox("--volume", "data:/mnt/data")
	if o, _, _ := sh(g.ID, "df -k /mnt/data | tail -n 1"); len(strings.Fields(o)) < 2 || len(strings.Fields(o)[1]) < 7 {
		t.Errorf("df after grow: %q; want about 2 GB", o)
	}
	if o, _, _ := sh(g.ID, "cat /mnt/data/canary"); o != "rewritten-twice\n" {
		t.Errorf("after the fold and the grow: %q, want the layer's write", o)
	}
	cli.OK("", nil, "delete", g.ID)

	// A fork: the source's volumes are detached while its snapshot is
	// written and attached again; the clone takes the read-only one
	// again, and cannot take the read-write one the source holds. Root
	// in the clone sees no disk of a volume not attached to it.
	cli.OK("", nil, "volume", "create", "ref", "--size", "1")
	f := newBox("--volume", "ref:/mnt/ref", "--volume", "data:/mnt/data:ro")
	sh(f.ID, "echo reference > /mnt/ref/r && sync")
	if _, e, code := cli.Run("", "fork", f.ID); code == 0 || !strings.Contains(e, "attached to sandbox "+f.ID) {
		t.Errorf("a fork taking the source's read-write volume: exit %d, %q", code, e)
	}
	var kid sandbox.Sandbox
	cli.OK("", &kid, "fork", f.ID, "--volume", "data:/mnt/data:ro")
	cli.Made(kid.ID)
	if len(kid.Volumes) != 1 || kid.Volumes[0].Name != "data" {
		t.Errorf("the clone's volumes: %+v", kid.Volumes)
	}
	if o, _, _ := sh(kid.ID, "cat /mnt/data/canary; ls /mnt/ref 2>/dev/null | wc -l; ls /sys/block | grep -c ^sd"); o != "rewritten-twice\n0\n1\n" {
		t.Errorf("in the clone: %q; want the read-only volume, nothing at /mnt/ref, one disk of a volume", o)
	}
	if o, e, code := sh(f.ID, "echo after-fork >> /mnt/ref/r && cat /mnt/ref/r /mnt/data/canary"); code != 0 || o != "reference\nafter-fork\nrewritten-twice\n" {
		t.Errorf("the source after the fork: exit %d, %q %q", code, o, e)
	}
	cli.OK("", nil, "delete", kid.ID)
	cli.OK("", nil, "delete", f.ID)
	cli.OK("", nil, "volume", "delete", "ref")

	// Another project sees none of it.
	cli.OK("", nil, "project", "create", "other")
	if _, e, code := cli.Run("", "volume", "get", "data", "--project", "other"); code == 0 || !strings.Contains(e, "no volume") {
		t.Errorf("another project's volume: exit %d, %q; want not found", code, e)
	}
	if _, e, code := cli.Run("", "new", "--image", "minimal", "--project", "other", "--volume", "data:/mnt/data"); code == 0 || !strings.Contains(e, "no volume") {
		t.Errorf("attach another project's volume: exit %d, %q; want not found", code, e)
	}

	if found := hypervisortest.FilesContaining(t, dataDir, []byte(canary)); len(found) > 0 {
		t.Errorf("the canary is in plain text in %v", found)
	}
	file := filepath.Join(dataDir, "volumes", vol.ID+".qcow2")
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the volume's file: %v", err)
	}
	keys := func() int {
		t.Helper()
		db, err := sql.Open("sqlite", "file:"+filepath.Join(dataDir, "harebox.db")+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM secrets WHERE scope = ?`, "volume/"+vol.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := keys(); n != 1 {
		t.Errorf("the volume's key: %d rows in the secret store, want 1", n)
	}
	cli.OK("", nil, "volume", "delete", "data")
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("the volume's file after delete: %v", err)
	}
	if n := keys(); n != 0 {
		t.Errorf("the volume's key after delete: %d rows, want none", n)
	}
	if _, e, code := cli.Run("", "volume", "get", "data"); code == 0 || !strings.Contains(e, "no volume") {
		t.Errorf("get after delete: exit %d, %q", code, e)
	}
	if found := hypervisortest.FilesContaining(t, dataDir, []byte(canary)); len(found) > 0 {
		t.Errorf("the canary is in plain text in %v after delete", found)
	}
}
