package history_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harebox/harebox/history"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

type rig struct {
	db   *store.DB
	sec  *secrets.Sealed
	h    *history.Service
	key  []byte
	skew atomic.Int64 // added to the clock
}

// newRig is a Service over a real SQLite store and sealed secret store,
// with one account (retention ret) whose sandbox sb has a data key.
func newRig(t *testing.T, ret store.Retention) *rig {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	db, err := store.OpenSQLite(ctx, filepath.Join(dir, "harebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	sec, err := secrets.NewSealed(db, filepath.Join(dir, "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.PutAccount(ctx, &store.Account{ID: "acc_1", Name: "a", CreatedAt: time.Now(), Retention: ret}); err != nil {
		t.Fatal(err)
	}
	r := &rig{db: db, sec: sec, key: make([]byte, secrets.DataKeySize)}
	rand.Read(r.key)
	r.h = history.New(history.Options{Store: db, Secrets: sec, Log: slog.Default(),
		Key: func(_ context.Context, id string) ([]byte, error) { return r.key, nil },
		Now: func() time.Time { return time.Now().Add(time.Duration(r.skew.Load())) }})
	return r
}

const sb = "sbx_0123456789abcdef0123456789"

func (r *rig) box(deleting func() bool) history.Sandbox {
	if deleting == nil {
		deleting = func() bool { return false }
	}
	return history.Sandbox{ID: sb, AccountID: "acc_1", Monitoring: true, Key: r.key, Deleting: deleting}
}

func (r *rig) list(t *testing.T) []sandbox.Command {
	t.Helper()
	l, err := r.h.List(context.Background(), sb, 0)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// An entry keeps the request and a bounded output, sealed under the
// sandbox's key; Erase removes it.
func TestRecordBoundsSealsErases(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, store.Retention{})
	big := strings.Repeat("x", history.OutputBytes+10)
	started := time.Now()
	r.h.Record(ctx, r.box(nil), "exec", &sandbox.ExecRequest{Cmd: "echo canary-cmd", User: "root", Cwd: "/tmp"}, started,
		&sandbox.ExecResult{Stdout: big, Stderr: "canary-err"})
	l := r.list(t)
	if len(l) != 1 {
		t.Fatalf("history: %+v", l)
	}
	c := l[0]
	if c.Kind != "exec" || c.Cmd != "echo canary-cmd" || c.User != "root" || c.Cwd != "/tmp" || c.SandboxID != sb || !strings.HasPrefix(c.ID, "cmd_") ||
		len(c.Result.Stdout) != history.OutputBytes || !c.Result.StdoutTruncated || c.Result.Stderr != "canary-err" || c.Result.StderrTruncated || c.OutputPurged {
		t.Fatalf("entry: %+v %+v", c, c.Result)
	}
	raw, err := r.sec.Get(ctx, "history/"+sb, c.ID)
	if err != nil || bytes.Contains(raw, []byte("canary")) {
		t.Fatalf("not sealed under the data key: %q %v", raw, err)
	}
	if err := r.h.Erase(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if l := r.list(t); len(l) != 0 {
		t.Fatalf("after Erase: %+v", l)
	}
	if _, err := r.sec.Get(ctx, "history/"+sb, c.ID); err == nil {
		t.Fatal("the sealed entry outlived Erase")
	}
}

// Monitoring off, history_days 0 and a begun delete keep nothing;
// output_days 0 keeps the entry without its output; a delete that begins
// while an entry is kept erases it.
func TestRecordKeepsWhatIsAllowed(t *testing.T) {
	ctx := context.Background()
	req, res := &sandbox.ExecRequest{Cmd: "true"}, &sandbox.ExecResult{Stdout: "out"}
	zero := 0
	r := newRig(t, store.Retention{HistoryDays: &zero})
	r.h.Record(ctx, r.box(nil), "exec", req, time.Now(), res)
	quiet := r.box(nil)
	quiet.Monitoring = false
	r.h.Record(ctx, quiet, "exec", req, time.Now(), res)
	r.h.Record(ctx, r.box(func() bool { return true }), "exec", req, time.Now(), res)
	if l := r.list(t); len(l) != 0 {
		t.Fatalf("kept %+v", l)
	}

	r = newRig(t, store.Retention{OutputDays: &zero})
	r.h.Record(ctx, r.box(nil), "stream", req, time.Now(), res)
	if l := r.list(t); len(l) != 1 || l[0].Result.Stdout != "" || !l[0].OutputPurged {
		t.Fatalf("output_days 0: %+v", l)
	}
	calls := 0 // false before the entry is kept, true after
	r.h.Record(ctx, r.box(func() bool { calls++; return calls > 1 }), "exec", req, time.Now(), res)
	if l := r.list(t); len(l) != 0 {
		t.Fatalf("an entry kept during a delete stayed: %+v", l)
	}
}

// Purge drops output older than output_days and entries older than
// history_days.
func TestPurge(t *testing.T) {
	ctx := context.Background()
	one, two := 1, 2
	r := newRig(t, store.Retention{HistoryDays: &two, OutputDays: &one})
	r.h.Record(ctx, r.box(nil), "exec", &sandbox.ExecRequest{Cmd: "old"}, time.Now(), &sandbox.ExecResult{Stdout: "old out"})
	r.h.Purge(ctx)
	if l := r.list(t); len(l) != 1 || l[0].Result.Stdout != "old out" {
		t.Fatalf("today: %+v", l)
	}
	r.skew.Store(int64(25 * time.Hour))
	r.h.Record(ctx, r.box(nil), "exec", &sandbox.ExecRequest{Cmd: "new"}, time.Now().Add(25*time.Hour), &sandbox.ExecResult{Stdout: "new out"})
	r.h.Purge(ctx)
	if l := r.list(t); len(l) != 2 || l[0].Result.Stdout != "" || !l[0].OutputPurged || l[1].Result.Stdout != "new out" {
		t.Fatalf("a day later: %+v", l)
	}
	r.skew.Store(int64(49 * time.Hour))
	r.h.Purge(ctx)
	if l := r.list(t); len(l) != 1 || l[0].Cmd != "new" {
		t.Fatalf("two days later: %+v", l)
	}
}

// Writers passes a stream through and keeps a bounded copy.
func TestWriters(t *testing.T) {
	var out bytes.Buffer
	o, e, wo, we := history.Writers(&out, nil)
	wo.Write([]byte(strings.Repeat("y", history.OutputBytes+1)))
	we.Write([]byte("err"))
	if out.Len() != history.OutputBytes+1 || len(o.Bytes()) != history.OutputBytes || !o.Truncated() || string(e.Bytes()) != "err" {
		t.Fatalf("out %d kept %d/%v err %q", out.Len(), len(o.Bytes()), o.Truncated(), e.Bytes())
	}
}
