package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/agent/guest"
	"github.com/harebox/harebox/model"
)

// Protocol 4 (what E2B's envd needs of the agent), through the client and
// the real agent on this machine's files.

func dialAgent(t *testing.T) (context.Context, *Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	c, _, err := DialReady(ctx, serveAgent(t, guest.New(guest.Options{})), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return ctx, c
}

func mkfile(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRenameAndListTree(t *testing.T) {
	ctx, c := dialAgent(t)
	d := t.TempDir()
	for _, p := range []string{"a", "sub/b", "sub/deeper/c", "sub/deeper/deepest/d"} {
		mkfile(t, filepath.Join(d, p))
	}
	fi, err := c.Rename(ctx, filepath.Join(d, "a"), filepath.Join(d, "sub", "a2"))
	if err != nil || fi.Path != filepath.Join(d, "sub", "a2") || fi.Type != "file" {
		t.Fatalf("rename: %+v %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(d, "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the source is still there: %v", err)
	}
	if _, err := c.Rename(ctx, filepath.Join(d, "missing"), filepath.Join(d, "x")); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("rename of a missing file: %v", err)
	}

	names := func(l []FileInfo) []string {
		var out []string
		for _, f := range l {
			rel, _ := filepath.Rel(d, f.Path)
			out = append(out, rel)
		}
		return out
	}
	l, trunc, err := c.ListTree(ctx, d, 1, 0)
	if got := strings.Join(names(l), " "); err != nil || trunc || got != "sub" {
		t.Errorf("depth 1: %q %v %v", got, trunc, err)
	}
	l, trunc, err = c.ListTree(ctx, d, 3, 0)
	if got := strings.Join(names(l), " "); err != nil || trunc || got != "sub sub/a2 sub/b sub/deeper sub/deeper/c sub/deeper/deepest" {
		t.Errorf("depth 3: %q %v %v", got, trunc, err)
	}
	l, trunc, err = c.ListTree(ctx, d, 3, 4)
	if err != nil || !trunc || len(l) != 4 {
		t.Errorf("depth 3, at most 4: %q %v %v", names(l), trunc, err)
	}
	if _, _, err := c.ListTree(ctx, d, 65, 0); !errors.Is(err, model.ErrInvalid) {
		t.Errorf("depth 65: %v", err)
	}
}

func TestWatch(t *testing.T) {
	ctx, c := dialAgent(t)
	d := t.TempDir()
	w, err := c.Watch(ctx, d, true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	next := func(want WatchOp, path string) {
		t.Helper()
		for {
			ev, err := w.Next()
			if err != nil {
				t.Fatalf("waiting for %s %s: %v", want, path, err)
			}
			if ev.Op == want && ev.Path == path {
				return
			}
			t.Logf("(also: %+v)", ev)
		}
	}
	f := filepath.Join(d, "f")
	mkfile(t, f)
	next(OpCreate, f)
	next(OpWrite, f)
	if err := os.Chmod(f, 0o600); err != nil {
		t.Fatal(err)
	}
	next(OpChmod, f)
	// A directory made after the watch began is watched too.
	sub := filepath.Join(d, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	next(OpCreate, sub)
	time.Sleep(100 * time.Millisecond) // (its watch is added as its event is read)
	g := filepath.Join(sub, "g")
	mkfile(t, g)
	next(OpCreate, g)
	if err := os.Rename(g, filepath.Join(d, "h")); err != nil {
		t.Fatal(err)
	}
	next(OpRename, g)
	next(OpCreate, filepath.Join(d, "h"))
	if err := os.Remove(f); err != nil {
		t.Fatal(err)
	}
	next(OpRemove, f)
	// The watched directory gone ends the watch, said so.
	if err := os.RemoveAll(d); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := w.Next()
		if err != nil {
			if !errors.Is(err, model.ErrNotFound) {
				t.Errorf("the watched directory removed: %v, want of kind not found", err)
			}
			break
		}
	}
	if _, err := c.Watch(ctx, filepath.Join(t.TempDir(), "missing"), false); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("watch of a missing directory: %v", err)
	}
	if _, err := c.Watch(ctx, "relative", false); !errors.Is(err, model.ErrInvalid) {
		t.Errorf("watch of a relative path: %v", err)
	}
	// At most 16 watches at once; the 17th is refused.
	for i := range 16 {
		w, err := c.Watch(ctx, t.TempDir(), false)
		if err != nil {
			t.Fatalf("watch %d: %v", i+1, err)
		}
		defer w.Close()
	}
	if w, err := c.Watch(ctx, t.TempDir(), false); !errors.Is(err, model.ErrCapacity) {
		t.Errorf("a 17th watch: %v", err)
		if err == nil {
			w.Close()
		}
	}
}

// A background command's stdin stays open for Input until CloseInput; one
// on a terminal is resized; a host can attach to either again.
func TestInputToCommands(t *testing.T) {
	ctx, c := dialAgent(t)
	output := func(id string) (string, *ExitStatus) {
		t.Helper()
		var out strings.Builder
		st, err := c.Attach(ctx, id, [2]uint64{}, true, func(_ bool, _ uint64, b []byte) error { out.Write(b); return nil })
		if err != nil {
			t.Fatalf("attach %s: %v", id, err)
		}
		return out.String(), st
	}
	if _, err := c.Start(ctx, "cat", ExecRequest{Argv: []string{"cat"}, User: "root", KeepStdin: true}, []byte("first\n"), 0); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"second\n", "third\n"} {
		if err := c.Input(ctx, "cat", []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.CloseInput(ctx, "cat"); err != nil {
		t.Fatal(err)
	}
	if out, st := output("cat"); out != "first\nsecond\nthird\n" || st == nil || st.ExitCode != 0 {
		t.Errorf("cat: %q %+v", out, st)
	}
	if err := c.Input(ctx, "cat", []byte("late")); !errors.Is(err, model.ErrState) {
		t.Errorf("input after the end: %v", err)
	}
	if _, err := c.Start(ctx, "closed", ExecRequest{Shell: "sleep 5", User: "root"}, nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Input(ctx, "closed", []byte("x")); !errors.Is(err, model.ErrState) {
		t.Errorf("input to a command without kept stdin: %v", err)
	}
	if err := c.Resize(ctx, "closed", 10, 10); !errors.Is(err, model.ErrState) {
		t.Errorf("resize of a command without a terminal: %v", err)
	}
	if err := c.Input(ctx, "nosuch", []byte("x")); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("input to no command: %v", err)
	}

	sh := `read a; stty size; read b; echo "b=$b"`
	if _, err := c.Start(ctx, "tty", ExecRequest{Shell: sh, User: "root", PTY: true, Rows: 24, Cols: 80, KeepStdin: true}, nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Resize(ctx, "tty", 50, 120); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"1\n", "2\n"} {
		if err := c.Input(ctx, "tty", []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	out, st := output("tty")
	if !strings.Contains(out, "50 120") || !strings.Contains(out, "b=2") || st == nil || st.ExitCode != 0 {
		t.Errorf("tty: %q %+v", out, st)
	}
	// Attached again: the same output, from the start.
	if again, _ := output("tty"); again != out {
		t.Errorf("attached again: %q, want %q", again, out)
	}
}

// What protocol 4 adds, asked of an older agent, fails saying so: a call
// it lacks, and a field it would ignore.
func TestProtocol4OlderAgent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, _, err := DialReady(ctx, serveAgent(t, oldAgent{}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	older := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, model.ErrInvalid) || !strings.Contains(err.Error(), "image built with this release") {
			t.Errorf("%s: %v", what, err)
		}
	}
	_, err = c.Rename(ctx, "/a", "/b")
	older("rename", err)
	_, err = c.Watch(ctx, "/", false)
	older("watch", err)
	older("input", c.Input(ctx, "x", []byte("y")))
	_, _, err = c.ListTree(ctx, "/", 2, 0)
	older("a listing with a depth", err)
	_, err = c.Start(ctx, "x", ExecRequest{Shell: "cat", KeepStdin: true}, nil, 0)
	older("keeping stdin open", err)
}

// A reader too slow for a watch's events loses some, and is told how
// many; the agent holds a bounded queue, not every event.
func TestWatchSlowReader(t *testing.T) {
	ctx, c := dialAgent(t)
	d := t.TempDir()
	w, err := c.Watch(ctx, d, false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const files = 20000
	for i := range files {
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f-%05d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	// Then, until one is seen, a marker now and then (one may be dropped).
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := 0; ; i++ {
			os.WriteFile(filepath.Join(d, fmt.Sprintf("last-%d", i)), nil, 0o644)
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	var got, dropped uint64
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatal(err)
		}
		got++
		dropped += ev.Dropped
		if strings.HasPrefix(filepath.Base(ev.Path), "last-") {
			break
		}
	}
	t.Logf("%d events read, %d dropped", got, dropped)
	if dropped == 0 || got >= files {
		t.Errorf("%d events read and %d dropped of %d creates: want some dropped", got, dropped, files)
	}
}
