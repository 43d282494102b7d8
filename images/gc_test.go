package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestGCPlan(t *testing.T) {
	h := time.Date(2026, 1, 10, 0, 0, 0, 0, time.UTC) // the horizon
	day := 24 * time.Hour
	b := func(name, dir string, built, used time.Time) build {
		return build{name: name, dir: "/c/" + dir, builtAt: built, usedAt: used}
	}
	builds := []build{
		// a: superseded long ago, one of them in use.
		b("a", "a-1", h.Add(-9*day), h.Add(-9*day)),
		b("a", "a-2", h.Add(-8*day), h.Add(-8*day)),
		b("a", "a-3", h.Add(-7*day), h.Add(-7*day)),
		// b: its newest came after the horizon: the one before was the
		// newest until then (a create may have picked it); the one
		// before that was not.
		b("b", "b-1", h.Add(-5*day), h.Add(-5*day)),
		b("b", "b-2", h.Add(-4*day), h.Add(-4*day)),
		b("b", "b-3", h.Add(time.Minute), h.Add(time.Minute)),
		// c: an old build a cache hit used after the horizon.
		b("c", "c-1", h.Add(-3*day), h.Add(time.Second)),
		b("c", "c-2", h.Add(-2*day), h.Add(-2*day)),
		// d: one build only, old: the newest all the same.
		b("d", "d-1", h.Add(-30*day), h.Add(-30*day)),
		// e: a tie in build time: one of them is the newest.
		b("e", "e-1", h.Add(-day), h.Add(-day)),
		b("e", "e-2", h.Add(-day), h.Add(-day)),
	}
	got := plan(builds, map[string]bool{"/c/a-2": true}, h)
	want := map[string]string{
		"/c/a-1": ReasonUnused, "/c/a-2": ReasonInUse, "/c/a-3": ReasonNewest,
		"/c/b-1": ReasonUnused, "/c/b-2": ReasonRecent, "/c/b-3": ReasonNewest,
		"/c/c-1": ReasonRecent, "/c/c-2": ReasonNewest,
		"/c/d-1": ReasonNewest,
		"/c/e-1": ReasonUnused, "/c/e-2": ReasonNewest,
	}
	for dir, w := range want {
		if got[dir] != w {
			t.Errorf("%s: %q, want %q", dir, got[dir], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("plan: %v", got)
	}
}

// fakeBuild writes a complete build as Build would (manifest, kernel,
// initrd with size bytes) and sets its directory's time to built.
func fakeBuild(t *testing.T, out, name, seed string, built time.Time, size int) string {
	t.Helper()
	sum := sha256.Sum256([]byte(seed))
	hash := hex.EncodeToString(sum[:])
	dir := filepath.Join(out, name+"-"+hash[:12])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, KernelFile), []byte("kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, InitrdFile), bytes.Repeat([]byte{1}, size), 0o644); err != nil {
		t.Fatal(err)
	}
	setBuiltAt(t, dir, Image{Name: name, Kernel: filepath.Join(dir, KernelFile), Initrd: filepath.Join(dir, InitrdFile),
		InputHash: hash}, built)
	return dir
}

// setBuiltAt writes img's manifest in dir with BuiltAt built and sets the
// directory's time to it (as if last used then).
func setBuiltAt(t *testing.T, dir string, img Image, built time.Time) {
	t.Helper()
	img.BuiltAt = built
	b, err := json.Marshal(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ManifestFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(dir, built, built); err != nil {
		t.Fatal(err)
	}
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// TestGCCache runs GC on a cache directory of fake builds, reference
// files and leftovers: a dry run removes nothing, the run removes what
// the dry run said and only that.
func TestGCCache(t *testing.T) {
	out := t.TempDir()
	now := time.Now()
	old := now.Add(-30 * 24 * time.Hour)
	mb := 1 << 20
	oldest := fakeBuild(t, out, "default", "1", old, mb)                      // unused
	staleRef := fakeBuild(t, out, "default", "2", old.Add(time.Hour), mb)     // a gone engine's only
	referenced := fakeBuild(t, out, "default", "3", old.Add(2*time.Hour), mb) // a live engine's
	afterRef := fakeBuild(t, out, "default", "4", now.Add(-2*time.Hour), mb)  // newest when the live file was written
	newest := fakeBuild(t, out, "default", "5", now.Add(-time.Hour), mb)
	onlyOne := fakeBuild(t, out, "minimal", "6", old, mb)
	// Not a build of Build's: another name than its manifest's.
	foreign := filepath.Join(out, "mine")
	if err := os.Rename(fakeBuild(t, out, "default", "7", old, mb), foreign); err != nil {
		t.Fatal(err)
	}
	// Leftovers: an interrupted GC's, a crashed build's, a running build's.
	gcLeft := filepath.Join(out, gcPrefix+"default-x-1")
	crashed := filepath.Join(out, ".tmp-default-y-1")
	running := filepath.Join(out, ".tmp-default-z-1")
	for _, d := range []string{gcLeft, crashed, running} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(crashed, old, old); err != nil {
		t.Fatal(err)
	}

	// A live engine (its data directory exists), its file written three
	// hours ago; a gone one's, old.
	live := t.TempDir()
	if err := WriteRefs(out, live, []string{referenced}, now.Add(-3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := WriteRefs(out, filepath.Join(live, "gone"), []string{staleRef}, old); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	dry, err := GC(ctx, out, GCOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]string{}
	for _, b := range append(dry.Kept, dry.Removed...) {
		reasons[b.Dir] = b.Reason
	}
	want := map[string]string{
		oldest: ReasonUnused, referenced: ReasonInUse, staleRef: ReasonUnused,
		// Superseded (by newest) after the live file was written: an
		// engine may have started using it since.
		afterRef: ReasonRecent, newest: ReasonNewest, onlyOne: ReasonNewest,
		gcLeft: ReasonLeftover, crashed: ReasonLeftover,
	}
	for d, w := range want {
		if reasons[d] != w {
			t.Errorf("%s: %q, want %q", filepath.Base(d), reasons[d], w)
		}
	}
	if len(reasons) != len(want) {
		t.Errorf("report has %d entries, want %d: %v", len(reasons), len(want), reasons)
	}
	if dry.FreedBytes < int64(2*mb) {
		t.Errorf("dry run frees %d bytes, want 2 builds' worth (%d+)", dry.FreedBytes, 2*mb)
	}
	var stale int
	for _, r := range dry.References {
		if r.Stale {
			stale++
		}
	}
	if len(dry.References) != 2 || stale != 1 {
		t.Errorf("references: %+v", dry.References)
	}
	for d := range want {
		if !exists(d) {
			t.Errorf("dry run removed %s", d)
		}
	}
	u := map[string]Usage{}
	for _, x := range dry.ByName() {
		u[x.Name] = x
	}
	if d := u["default"]; d.Builds != 5 || d.Unused != 2 || d.ReclaimableBytes < int64(2*mb) || d.Bytes < int64(5*mb) {
		t.Errorf("usage of default: %+v", d)
	}

	r, err := GC(ctx, out, GCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.FreedBytes != dry.FreedBytes || len(r.Removed) != len(dry.Removed) {
		t.Errorf("GC freed %d bytes (%d dirs), the dry run said %d (%d)", r.FreedBytes, len(r.Removed), dry.FreedBytes, len(dry.Removed))
	}
	for d, w := range want {
		if gone := !exists(d); gone != (w == ReasonUnused || w == ReasonLeftover) {
			t.Errorf("%s (%s): removed %v", filepath.Base(d), w, gone)
		}
	}
	for _, d := range []string{foreign, running} {
		if !exists(d) {
			t.Errorf("%s removed: not GC's", filepath.Base(d))
		}
	}
	if left, _ := filepath.Glob(filepath.Join(out, gcPrefix+"*")); len(left) > 0 {
		t.Errorf("left %v", left)
	}
	refs, _ := filepath.Glob(filepath.Join(out, RefsDir, "*"))
	if len(refs) != 1 {
		t.Errorf("reference files after GC: %v (want the live one only)", refs)
	}

	// Once the live engine writes that it no longer uses it, and time
	// passed: only the newest of each name is left.
	if err := WriteRefs(out, live, nil, now); err != nil {
		t.Fatal(err)
	}
	later := func() time.Time { return now.Add(GCGrace + time.Minute) }
	if _, err := GC(ctx, out, GCOptions{Now: later}); err != nil {
		t.Fatal(err)
	}
	builds, _, err := scanCache(out, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(builds) != 2 || !exists(newest) || !exists(onlyOne) {
		t.Errorf("builds left: %+v", builds)
	}

	// An unreadable reference file stops GC: it might name a build in use.
	if err := os.WriteFile(filepath.Join(out, RefsDir, "bad.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := GC(ctx, out, GCOptions{}); err == nil || !strings.Contains(err.Error(), "bad.json") {
		t.Errorf("GC with an unreadable reference file: %v", err)
	}
}

// TestGCLockHoldsCacheHits: while GC holds the cache's lock (picking and
// moving builds aside), a build's cache look-up waits, and the build it
// then finds is marked used, so the next GC keeps it.
func TestGCLockHoldsCacheHits(t *testing.T) {
	out := t.TempDir()
	old := time.Now().Add(-72 * time.Hour)
	a := fakeBuild(t, out, "minimal", "1", old, 4096)
	fakeBuild(t, out, "minimal", "2", old.Add(time.Hour), 4096) // a is superseded
	img, err := Load(a)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := lockCache(out, syscall.LOCK_EX)
	if err != nil {
		t.Fatal(err)
	}
	found := make(chan bool)
	go func() {
		_, ok := cached(out, a, img.InputHash)
		found <- ok
	}()
	select {
	case <-found:
		t.Fatal("a cache look-up went ahead while GC held the lock")
	case <-time.After(200 * time.Millisecond):
	}
	unlock()
	if !<-found {
		t.Fatal("the cached build was not found")
	}
	if err := WriteRefs(out, t.TempDir(), nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	r, err := GC(context.Background(), out, GCOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Removed) != 0 || !exists(a) {
		t.Errorf("GC removed the build a cache hit just returned: %+v", r)
	}
}
