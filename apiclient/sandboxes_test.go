package apiclient_test

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/internal/testapi"
	"github.com/harebox/harebox/processes"
	"github.com/harebox/harebox/sandbox"
)

// client is a client of hareboxd's API on the fake hypervisor.
func client(t *testing.T) *apiclient.Client {
	c, err := apiclient.New(testapi.Server(t))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSandboxMethods: the walkthrough and the rest of a sandbox's life
// through the typed methods.
func TestSandboxMethods(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	box, err := c.Create(ctx, sandbox.CreateRequest{Name: "untrusted", NoEnv: true, TTLSeconds: 900, Labels: map[string]string{"job": "w"}})
	if err != nil || box.ID == "" || box.State != sandbox.StateRunning {
		t.Fatalf("create: %+v %v", box, err)
	}
	policy, err := firewall.Parse([]byte(`{"default_outbound": "deny", "outbound": [{"action": "allow", "protocol": "tcp", "ports": "443", "hosts": ["pypi.org", "files.pythonhosted.org"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetFirewall(ctx, box.ID, policy); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Firewall(ctx, box.ID); err != nil || !reflect.DeepEqual(got, policy) {
		t.Fatalf("firewall: %+v %v, want %+v", got, err, policy)
	}
	if fi, err := c.WriteFile(ctx, box.ID, "/home/user/job/job.py", bytes.NewBufferString("print('hi')\n"), apiclient.WriteOptions{Mode: 0o600, MakeParents: true}); err != nil || fi.Size != 12 {
		t.Fatalf("write: %+v %v", fi, err)
	}
	if fi, err := c.StatFile(ctx, box.ID, "/home/user/job/job.py"); err != nil || fi.Mode&0o777 != 0o600 || fi.Size != 12 {
		t.Fatalf("stat: %+v %v", fi, err)
	}
	var buf bytes.Buffer
	if n, err := c.ReadFile(ctx, box.ID, "/home/user/job/job.py", &buf); err != nil || n != 12 || buf.String() != "print('hi')\n" {
		t.Fatalf("read: %d %q %v", n, buf.String(), err)
	}
	if fi, err := c.MoveFile(ctx, box.ID, "/home/user/job/job.py", "/home/user/job/main.py"); err != nil || fi.Path != "/home/user/job/main.py" || fi.Size != 12 {
		t.Fatalf("move: %+v %v", fi, err)
	}
	if _, err := c.StatFile(ctx, box.ID, "/home/user/job/job.py"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("stat what was moved away: %v", err)
	}
	if r, err := c.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "echo out; echo err >&2; exit 3"}); err != nil || r.Stdout != "out\n" || r.Stderr != "err\n" || r.ExitCode != 3 {
		t.Fatalf("exec: %+v %v", r, err)
	}

	done, err := c.StartProcess(ctx, box.ID, sandbox.ExecRequest{Cmd: "sleep 0.2; echo done"})
	if err != nil || !done.Running {
		t.Fatalf("start process: %+v %v", done, err)
	}
	long, err := c.StartProcess(ctx, box.ID, sandbox.ExecRequest{Cmd: "sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if p, err := c.WaitProcess(wctx, box.ID, done.ID); err != nil || p.Running || p.Result == nil || p.Result.Stdout != "done\n" {
		t.Fatalf("wait: %+v %v", p, err)
	}
	// Input over REST: refused to a process whose stdin was not kept open
	// (the REST start does not keep it), to no process, and when bad.
	if err := c.SendProcessInput(ctx, box.ID, long.ID, sandbox.ProcessInput{Stdin: []byte("x")}); !errors.Is(err, sandbox.ErrState) {
		t.Fatalf("input to a process without stdin: %v", err)
	}
	if err := c.SendProcessInput(ctx, box.ID, "proc_nosuch", sandbox.ProcessInput{EOF: true}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("input to no process: %v", err)
	}
	if err := c.SendProcessInput(ctx, box.ID, long.ID, sandbox.ProcessInput{Rows: 10}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("rows without cols: %v", err)
	}
	if err := c.KillProcess(ctx, box.ID, long.ID, 0); err != nil {
		t.Fatal(err)
	}
	if p, err := c.WaitProcess(wctx, box.ID, long.ID); err != nil || p.Result == nil || p.Result.Signal != 9 {
		t.Fatalf("killed: %+v %v", p, err)
	}
	if l, err := c.ListProcesses(ctx, box.ID); err != nil || len(l) != 2 {
		t.Fatalf("processes: %+v %v", l, err)
	}
	if p, err := c.GetProcess(ctx, box.ID, done.ID); err != nil || p.Result == nil || p.Result.ExitCode != 0 {
		t.Fatalf("get process: %+v %v", p, err)
	}

	for _, step := range []struct {
		call func(context.Context, string) (*sandbox.Sandbox, error)
		want sandbox.State
	}{{c.Pause, sandbox.StatePaused}, {c.Resume, sandbox.StateRunning}, {c.Stop, sandbox.StateStopped}, {c.Start, sandbox.StateRunning}} {
		if got, err := step.call(ctx, box.ID); err != nil || got.State != step.want {
			t.Fatalf("want %s: %+v %v", step.want, got, err)
		}
	}
	snap, err := c.Snapshot(ctx, box.ID, sandbox.SnapshotRequest{Name: "base"})
	if err != nil || snap.ID == "" {
		t.Fatalf("snapshot: %+v %v", snap, err)
	}
	clones, err := c.Fork(ctx, box.ID, sandbox.ForkRequest{Count: 2})
	if err != nil || len(clones) != 2 || clones[0].ID == box.ID {
		t.Fatalf("fork: %+v %v", clones, err)
	}
	if l, err := c.List(ctx, sandbox.ListFilter{Labels: map[string]string{"job": "w"}, State: sandbox.StateRunning}); err != nil || len(l) != 3 {
		t.Fatalf("list by label: %d %v", len(l), err)
	}
	if l, err := c.List(ctx, sandbox.ListFilter{Labels: map[string]string{"job": "other"}}); err != nil || len(l) != 0 {
		t.Fatalf("list by another label: %d %v", len(l), err)
	}
	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	for _, b := range append(clones, box) {
		if err := c.Delete(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := c.Get(ctx, box.ID); err == nil && got.State != sandbox.StateDeleted {
		t.Fatalf("after delete: %+v", got)
	}
	// Errors are *Error, with the API's status and code.
	_, err = c.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "true"})
	var ae *apiclient.Error
	if !errors.As(err, &ae) || (ae.Status != 404 && ae.Status != 409) {
		t.Fatalf("exec in a deleted sandbox: %v", err)
	}
	if _, err := c.Get(ctx, "sbx_nosuch"); !errors.As(err, &ae) || ae.Status != 404 || ae.Code != "not_found" {
		t.Fatalf("get of no sandbox: %v", err)
	}
}

// TestSameNamesAsTheLibrary: every sandbox method of the client is a
// method of the engine with the same name and as many arguments and
// results, so code moves between the two by changing its receiver; the
// process methods are the engine's Processes() service's, named without
// "Process" (StartProcess is Processes().Start), and the snapshot methods
// its Snapshots() service's (Snapshot is Snapshots().Take, DeleteSnapshot
// Snapshots().Delete).
func TestSameNamesAsTheLibrary(t *testing.T) {
	ct := reflect.TypeFor[*apiclient.Client]()
	et, pt, st := reflect.TypeFor[*harebox.Engine](), reflect.TypeFor[*processes.Service](), reflect.TypeFor[*clone.Snapshots]()
	shared := 0
	check := func(name string, et reflect.Type, ename string) {
		cm, ok1 := ct.MethodByName(name)
		em, ok2 := et.MethodByName(ename)
		if !ok1 || !ok2 {
			t.Errorf("%s: on the client %v, on the engine (%v.%s) %v", name, ok1, et, ename, ok2)
			return
		}
		if cm.Type.NumIn() != em.Type.NumIn() || cm.Type.NumOut() != em.Type.NumOut() {
			t.Errorf("%s: client %v, engine %v", name, cm.Type, em.Type)
		}
		for i := 1; i < cm.Type.NumIn(); i++ {
			if a, b := cm.Type.In(i), em.Type.In(i); a != b && a.Name() != b.Name() {
				t.Errorf("%s: argument %d is %v on the client, %v on the engine", name, i, a, b)
			}
		}
		shared++
	}
	for _, name := range []string{"Create", "Get", "List", "Delete", "Pause", "Resume", "Stop", "Start", "Hibernate",
		"Exec", "WriteFile", "ReadFile", "StatFile", "MoveFile", "Firewall", "SetFirewall"} {
		check(name, et, name)
	}
	for _, name := range []string{"StartProcess", "ListProcesses", "GetProcess", "WaitProcess", "KillProcess", "SendProcessInput"} {
		check(name, pt, strings.NewReplacer("Processes", "", "Process", "").Replace(name))
	}
	for name, ename := range map[string]string{"Snapshot": "Take", "Fork": "Fork", "DeleteSnapshot": "Delete"} {
		check(name, st, ename)
	}
	if shared == 0 {
		t.Fatal("no shared method checked")
	}
}
