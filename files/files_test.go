package files_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/harebox/harebox/files"
	"github.com/harebox/harebox/internal/testdomains"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// one is the engine as the service sees it, with one running sandbox:
// any other is not found, and a stopped one is not running.
type one struct {
	testdomains.Sandbox
	agent   files.Agent
	stopped bool
}

func (o *one) Running(_ context.Context, id string) (files.Agent, error) {
	if o.stopped {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is stopped; it must be running", id)
	}
	return o.agent, nil
}

// TestFiles reads and writes a memhv guest's files through the service,
// over the real audit log: the size limit both ways (an upload over it
// refused, not truncated; a file over it refused before anything is
// written), a mode out of range, a move, a listing down to a depth, a depth out of range, a directory read
// as a file, a sandbox the caller may not see and one not running, and
// every call but a stat in the audit log.
func TestFiles(t *testing.T) {
	ctx := context.Background()
	parts := testdomains.New(t)
	id := sandbox.NewID()
	sbs := &one{Sandbox: testdomains.Sandbox{ID: id, Account: parts.Account.ID}, agent: testdomains.Agent(t, parts.Dir)}
	const limit = 1 << 10
	s := files.New(files.Options{Sandboxes: sbs, Audit: parts.Audit, MaxFileBytes: limit})

	body := strings.Repeat("x", limit)
	fi, err := s.Write(ctx, id, "/tmp/d/a.txt", strings.NewReader(body), sandbox.WriteOptions{Mode: 0o640, MakeParents: true})
	if err != nil || fi.Size != limit || fi.Mode != 0o640 {
		t.Fatalf("write at the limit: %+v %v", fi, err)
	}
	var got bytes.Buffer
	if n, err := s.Read(ctx, id, "/tmp/d/a.txt", &got); err != nil || n != limit || got.String() != body {
		t.Fatalf("read: %d %v", n, err)
	}
	if _, err := s.Write(ctx, id, "/tmp/d/big.txt", strings.NewReader(body+"y"), sandbox.WriteOptions{}); !errors.Is(err, sandbox.ErrTooLarge) {
		t.Fatalf("one byte over the limit: %v", err)
	}
	if _, err := s.Stat(ctx, id, "/tmp/d/big.txt"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("the refused upload left a file: %v", err)
	}
	if _, err := s.Write(ctx, id, "/tmp/d/m", strings.NewReader(""), sandbox.WriteOptions{Mode: 0o10000}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("mode 010000: %v", err)
	}
	// A file that grew past the limit in the guest is refused whole.
	if _, err := s.Write(ctx, id, "/tmp/d/b.txt", strings.NewReader(body), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Move(ctx, id, "/tmp/d/b.txt", "/tmp/d/c.txt"); err != nil {
		t.Fatal(err)
	}
	got.Reset()
	if _, err := s.Mkdir(ctx, id, "/tmp/d/sub/deeper", 0o755, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read(ctx, id, "/tmp/d/sub", &got); !errors.Is(err, sandbox.ErrInvalid) || got.Len() != 0 {
		t.Errorf("a directory read as a file: %v (%d bytes written)", err, got.Len())
	}
	list, truncated, err := s.List(ctx, id, "/tmp/d", 2)
	names := map[string]bool{}
	for _, f := range list {
		names[f.Path] = true
	}
	if err != nil || truncated || !names["/tmp/d/a.txt"] || !names["/tmp/d/c.txt"] || !names["/tmp/d/sub/deeper"] || names["/tmp/d/b.txt"] {
		t.Errorf("list: %v %v %v", names, truncated, err)
	}
	if _, _, err := s.List(ctx, id, "/tmp/d", sandbox.MaxListDepth+1); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("depth over the maximum: %v", err)
	}
	if err := s.Remove(ctx, id, "/tmp/d", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(ctx, id, "/tmp/d"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("after a recursive remove: %v", err)
	}
	// (memhv's agent does not watch: a real guest's does, in e2e.)
	other := sandbox.NewID()
	if _, err := s.Watch(ctx, other, "/tmp", false); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a watch of another sandbox: %v", err)
	}
	if _, err := s.Read(ctx, other, "/etc/hostname", &got); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("another sandbox: %v", err)
	}
	sbs.stopped = true
	if _, err := s.Stat(ctx, id, "/tmp"); !errors.Is(err, sandbox.ErrState) {
		t.Errorf("a stopped sandbox: %v", err)
	}

	entries, err := parts.Audit.List(ctx, store.AuditFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		seen[fmt.Sprintf("%s %s %s %s", e.Action, e.Target, e.Outcome, e.Error)] = true
		if e.Action == "statFile" {
			t.Errorf("a stat was audited: %+v", e)
		}
		if e.Target == id && e.AccountID != parts.Account.ID {
			t.Errorf("an entry without the sandbox's account: %+v", e)
		}
	}
	for _, want := range []string{
		"writeFile " + id + " ok ", "readFile " + id + " ok ", "writeFile " + id + " error too_large", "writeFile " + id + " error invalid",
		"moveFile " + id + " ok ", "mkdir " + id + " ok ", "readFile " + id + " error invalid", "listFiles " + id + " ok ",
		"listFiles " + id + " error invalid", "removeFile " + id + " ok ", "readFile " + other + " denied not_found", "listFiles " + other + " denied not_found",
	} {
		if !seen[want] {
			t.Errorf("no audit entry %q in %v", want, seen)
		}
	}
}
