package envd_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/harebox/harebox"
	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/agent/guest"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/e2b/envd"
	fspb "github.com/harebox/harebox/e2b/envdpb/filesystem"
	"github.com/harebox/harebox/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
)

// sandboxes is envd's Access for several sandboxes: each its own token,
// each acting as a key that sees only the sandbox scope names (itself,
// unless a test mixes them up).
type sandboxes struct {
	tokens  map[string]string
	scope   map[string]string
	account string
}

func (a sandboxes) Token(_ context.Context, id string) (string, error) {
	if t, ok := a.tokens[id]; ok {
		return t, nil
	}
	return "", errors.New("no such sandbox")
}

func (a sandboxes) Principal(_ context.Context, id string) (authz.Principal, error) {
	if _, ok := a.tokens[id]; !ok {
		return authz.Principal{}, errors.New("no such sandbox")
	}
	see := id
	if s, ok := a.scope[id]; ok {
		see = s
	}
	return authz.Principal{AccountID: a.account, KeyID: "envd:" + id, Scope: authz.Scope{Sandboxes: []string{see}}}, nil
}

// memEngine is a real engine on the in-memory hypervisor with n
// sandboxes, and their account; a file is at most 1 MiB.
func memEngine(t *testing.T, n int) (*harebox.Engine, []string, string) {
	t.Helper()
	return memEngineFiles(t, n, 1<<20)
}

// memEngineFiles is memEngine with files of at most maxFile bytes.
func memEngineFiles(t *testing.T, n int, maxFile int64) (*harebox.Engine, []string, string) {
	t.Helper()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "hbenvdfs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	eng, err := harebox.New(ctx, harebox.Options{DataDir: dir, Hypervisor: hv,
		Images:   map[string]images.Image{sandbox.DefaultImage: memhv.Image(dir)},
		Capacity: harebox.Capacity{VCPUs: 8, MemoryMB: 8192, DiskGB: 100}, MaxFileBytes: maxFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	var ids []string
	var account string
	for range n {
		sb, err := eng.Create(ctx, sandbox.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids, account = append(ids, sb.ID), sb.AccountID
	}
	return eng, ids, account
}

// codecs are the two the SDKs may speak: JSON (the JS SDK's) and binary.
var codecs = map[string][]connect.ClientOption{"json": {connect.WithProtoJSON()}, "binary": nil}

// fsClient is a Connect client of envd's filesystem service served for
// sandbox id.
func fsClient(t *testing.T, s *envd.Server, id string, opts []connect.ClientOption) filesystemconnect.FilesystemClient {
	t.Helper()
	srv := httptest.NewServer(s.Handler(id))
	t.Cleanup(srv.Close)
	return filesystemconnect.NewFilesystemClient(srv.Client(), srv.URL, opts...)
}

// as sets a request's token and user (as the SDK does: Basic, the user
// and no password).
func as[T any](m *T, token, user string) *connect.Request[T] {
	r := connect.NewRequest(m)
	if token != "" {
		r.Header().Set("X-Access-Token", token)
	}
	if user != "" {
		r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	return r
}

func code(err error) connect.Code {
	if err == nil {
		return 0
	}
	return connect.CodeOf(err)
}

// envd's filesystem service over a real engine on memhv, in both codecs.
func TestFilesystemService(t *testing.T) {
	ctx := context.Background()
	eng, ids, account := memEngine(t, 2)
	a, b := ids[0], ids[1]
	acc := sandboxes{tokens: map[string]string{a: "tok-a", b: "tok-b"}, account: account}
	s := envd.New(envd.Options{Files: eng, Filesystem: eng, Access: acc})
	if _, err := eng.WriteFile(ctx, a, "/home/user/notes/a.txt", strings.NewReader("hello"), sandbox.WriteOptions{MakeParents: true}); err != nil {
		t.Fatal(err)
	}

	for name, opts := range codecs {
		t.Run(name, func(t *testing.T) {
			c := fsClient(t, s, a, opts)
			dir := "work-" + name // relative: under the user's home
			home := "/home/user/" + dir

			// MakeDir: made owned by the caller, then AlreadyExists (the
			// SDK's makeDir answers false), a file in the way refused.
			r, err := c.MakeDir(ctx, as(&fspb.MakeDirRequest{Path: dir + "/sub"}, "tok-a", ""))
			if err != nil {
				t.Fatal(err)
			}
			if e := r.Msg.GetEntry(); e.GetPath() != home+"/sub" || e.GetName() != "sub" || e.GetType() != fspb.FileType_FILE_TYPE_DIRECTORY ||
				e.GetOwner() != "user" || e.GetGroup() != "user" || !strings.HasPrefix(e.GetPermissions(), "d") {
				t.Errorf("made: %v", e)
			}
			if _, err := c.MakeDir(ctx, as(&fspb.MakeDirRequest{Path: dir + "/sub"}, "tok-a", "")); code(err) != connect.CodeAlreadyExists {
				t.Errorf("make an existing directory: %v", err)
			}
			if _, err := c.MakeDir(ctx, as(&fspb.MakeDirRequest{Path: "notes/a.txt"}, "tok-a", "")); code(err) != connect.CodeInvalidArgument {
				t.Errorf("make a directory over a file: %v", err)
			}
			r, err = c.MakeDir(ctx, as(&fspb.MakeDirRequest{Path: "/tmp/" + dir}, "tok-a", "root"))
			if err != nil || r.Msg.GetEntry().GetOwner() != "root" || r.Msg.GetEntry().GetPath() != "/tmp/"+dir {
				t.Errorf("make a directory as root: %v %v", r, err)
			}
			r, err = c.MakeDir(ctx, as(&fspb.MakeDirRequest{Path: dir}, "tok-a", "root"))
			if err != nil || r.Msg.GetEntry().GetPath() != "/root/"+dir {
				t.Errorf("root's relative path is from /root: %v %v", r, err)
			}

			// Stat: a file as envd describes it; a missing one NotFound
			// (the SDK's exists answers false).
			st, err := c.Stat(ctx, as(&fspb.StatRequest{Path: "notes/a.txt"}, "tok-a", "user"))
			if err != nil {
				t.Fatal(err)
			}
			if e := st.Msg.GetEntry(); e.GetPath() != "/home/user/notes/a.txt" || e.GetName() != "a.txt" || e.GetType() != fspb.FileType_FILE_TYPE_FILE ||
				e.GetSize() != 5 || e.GetMode() != 0o644 || e.GetPermissions() != "-rw-r--r--" || e.GetOwner() != "user" ||
				e.GetModifiedTime().AsTime().IsZero() || e.SymlinkTarget != nil {
				t.Errorf("stat: %v", e)
			}
			if _, err := c.Stat(ctx, as(&fspb.StatRequest{Path: "nothing"}, "tok-a", "")); code(err) != connect.CodeNotFound {
				t.Errorf("stat a missing file: %v", err)
			}

			// ListDir, down to a depth.
			if _, err := c.MakeDir(ctx, as(&fspb.MakeDirRequest{Path: dir + "/sub/deeper/deepest"}, "tok-a", "")); err != nil {
				t.Fatal(err)
			}
			names := func(depth uint32) string {
				t.Helper()
				l, err := c.ListDir(ctx, as(&fspb.ListDirRequest{Path: dir, Depth: depth}, "tok-a", ""))
				if err != nil {
					t.Fatalf("list depth %d: %v", depth, err)
				}
				var out []string
				for _, e := range l.Msg.GetEntries() {
					out = append(out, strings.TrimPrefix(e.GetPath(), home+"/"))
				}
				sort.Strings(out)
				return strings.Join(out, " ")
			}
			if got := names(0); got != "sub" {
				t.Errorf("list depth 0: %q", got)
			}
			if got := names(1); got != "sub" {
				t.Errorf("list depth 1: %q", got)
			}
			if got := names(3); got != "sub sub/deeper sub/deeper/deepest" {
				t.Errorf("list depth 3: %q", got)
			}
			if _, err := c.ListDir(ctx, as(&fspb.ListDirRequest{Path: dir, Depth: sandbox.MaxListDepth + 1}, "tok-a", "")); code(err) != connect.CodeInvalidArgument {
				t.Errorf("list too deep: %v", err)
			}
			if _, err := c.ListDir(ctx, as(&fspb.ListDirRequest{Path: "nothing"}, "tok-a", "")); code(err) != connect.CodeNotFound {
				t.Errorf("list a missing directory: %v", err)
			}

			// Move: the destination's missing parents made; the source
			// gone; a missing source NotFound.
			if _, err := eng.WriteFile(ctx, a, home+"/m.txt", strings.NewReader("move me"), sandbox.WriteOptions{}); err != nil {
				t.Fatal(err)
			}
			mv, err := c.Move(ctx, as(&fspb.MoveRequest{Source: dir + "/m.txt", Destination: dir + "/new/parents/m2.txt"}, "tok-a", ""))
			if err != nil || mv.Msg.GetEntry().GetPath() != home+"/new/parents/m2.txt" || mv.Msg.GetEntry().GetSize() != 7 {
				t.Fatalf("move: %v %v", mv, err)
			}
			if _, err := c.Stat(ctx, as(&fspb.StatRequest{Path: dir + "/m.txt"}, "tok-a", "")); code(err) != connect.CodeNotFound {
				t.Errorf("the moved file is still there: %v", err)
			}
			if _, err := c.Move(ctx, as(&fspb.MoveRequest{Source: dir + "/nothing", Destination: dir + "/x"}, "tok-a", "")); code(err) != connect.CodeNotFound {
				t.Errorf("move a missing file: %v", err)
			}

			// Remove: with what is below; a missing path is removed already.
			if _, err := c.Remove(ctx, as(&fspb.RemoveRequest{Path: dir + "/new"}, "tok-a", "")); err != nil {
				t.Errorf("remove a tree: %v", err)
			}
			if _, err := eng.StatFile(ctx, a, home+"/new/parents/m2.txt"); !errors.Is(err, model.ErrNotFound) {
				t.Errorf("removed, yet: %v", err)
			}
			if _, err := c.Remove(ctx, as(&fspb.RemoveRequest{Path: dir + "/new"}, "tok-a", "")); err != nil {
				t.Errorf("remove what is not there: %v", err)
			}

			// Bad input: each refused, nothing done.
			for what, err := range map[string]error{
				"remove no path": func() error { _, err := c.Remove(ctx, as(&fspb.RemoveRequest{}, "tok-a", "")); return err }(),
				"make no path":   func() error { _, err := c.MakeDir(ctx, as(&fspb.MakeDirRequest{}, "tok-a", "")); return err }(),
				"move to nowhere": func() error {
					_, err := c.Move(ctx, as(&fspb.MoveRequest{Source: "notes/a.txt"}, "tok-a", ""))
					return err
				}(),
				"a long path": func() error {
					_, err := c.Stat(ctx, as(&fspb.StatRequest{Path: strings.Repeat("a/", 3000)}, "tok-a", ""))
					return err
				}(),
				"a NUL in the path": func() error {
					_, err := c.MakeDir(ctx, as(&fspb.MakeDirRequest{Path: "bad\x00name"}, "tok-a", ""))
					return err
				}(),
			} {
				if code(err) != connect.CodeInvalidArgument {
					t.Errorf("%s: %v", what, err)
				}
			}
			if _, err := c.MakeDir(ctx, as(&fspb.MakeDirRequest{Path: "x"}, "tok-a", "../etc")); code(err) != connect.CodeUnauthenticated {
				t.Errorf("a bad user: %v", err)
			}
			if _, err := eng.StatFile(ctx, a, "/home/user/notes/a.txt"); err != nil {
				t.Errorf("bad input moved the file: %v", err)
			}
		})
	}

	// A wrong token, none, or another sandbox's: unauthenticated, and
	// nothing done.
	c := fsClient(t, s, a, nil)
	for what, tok := range map[string]string{"a wrong token": "tok-x", "no token": "", "another sandbox's token": "tok-b"} {
		if _, err := c.MakeDir(ctx, as(&fspb.MakeDirRequest{Path: "/tmp/refused"}, tok, "")); code(err) != connect.CodeUnauthenticated {
			t.Errorf("%s: %v", what, err)
		}
		st, err := c.WatchDir(ctx, as(&fspb.WatchDirRequest{Path: "/tmp"}, tok, ""))
		if err == nil {
			if st.Receive() {
				t.Errorf("%s: a watch started", what)
			}
			err = st.Err()
			st.Close()
		}
		if code(err) != connect.CodeUnauthenticated {
			t.Errorf("%s: watch: %v", what, err)
		}
	}
	if _, err := eng.StatFile(ctx, a, "/tmp/refused"); !errors.Is(err, model.ErrNotFound) {
		t.Errorf("a refused call made a directory: %v", err)
	}
	// B's envd acts as a key of B's only: an Access that mixed them up
	// still reaches nothing of A, since the engine authorizes each call.
	mixed := envd.New(envd.Options{Files: eng, Filesystem: eng, Access: sandboxes{tokens: acc.tokens, scope: map[string]string{a: b}, account: account}})
	ca := fsClient(t, mixed, a, nil)
	if _, err := ca.Stat(ctx, as(&fspb.StatRequest{Path: "notes/a.txt"}, "tok-a", "")); code(err) != connect.CodeNotFound {
		t.Errorf("a principal of another sandbox: %v", err)
	}

	// memhv's agent serves no watches (as an older agent would not): the
	// call says so, and the failed watches hold no slot.
	for range envd.MaxWatches + 1 {
		if _, err := c.CreateWatcher(ctx, as(&fspb.CreateWatcherRequest{Path: "notes"}, "tok-a", "")); code(err) != connect.CodeInvalidArgument {
			t.Fatalf("a watch on memhv: %v", err)
		}
	}
}

// agentFiles is the engine for what memhv serves, and a real agent (on
// this machine's files) for watches and the stats of their entries.
type agentFiles struct {
	*harebox.Engine
	c *agentclient.Client
}

func (f agentFiles) StatFile(ctx context.Context, _, path string) (*sandbox.FileInfo, error) {
	fi, err := f.c.Stat(ctx, path)
	if err != nil {
		return nil, err
	}
	v := sandbox.FileInfo(fi)
	return &v, nil
}

func (f agentFiles) WatchDir(ctx context.Context, _, path string, recursive bool) (sandbox.Watcher, error) {
	w, err := f.c.Watch(ctx, path, recursive)
	if err != nil {
		return nil, err
	}
	return agentWatch{w}, nil
}

type agentWatch struct{ *agentclient.Watcher }

func (w agentWatch) Next() (sandbox.FileEvent, error) {
	ev, err := w.Watcher.Next()
	return sandbox.FileEvent{Path: ev.Path, Op: string(ev.Op), Dropped: ev.Dropped}, err
}

// realAgent serves the real agent on a Unix socket and dials it.
func realAgent(t *testing.T) *agentclient.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); l.Close() })
	srv := guest.New(guest.Options{})
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go guest.ServeConn(ctx, conn, srv)
		}
	}()
	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	defer dcancel()
	c, _, err := agentclient.DialReady(dctx, hypervisor.AgentEndpoint{Transport: hypervisor.TransportSerial, Path: sock}, agentclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// WatchDir and the polled watchers over the real agent: the start event
// at once, changes named from the watched directory with their entries,
// keepalives, and the watch's end when the agent goes.
func TestWatchOverTheAgent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eng, ids, account := memEngine(t, 1)
	agent := realAgent(t)
	s := envd.New(envd.Options{Files: eng, Filesystem: agentFiles{eng, agent}, Access: sandboxes{tokens: map[string]string{ids[0]: "tok"}, account: account}})

	for name, opts := range codecs {
		t.Run(name, func(t *testing.T) {
			c := fsClient(t, s, ids[0], opts)
			dir := t.TempDir()
			req := as(&fspb.WatchDirRequest{Path: dir, Recursive: true, IncludeEntry: true}, "tok", "")
			req.Header().Set("Keepalive-Ping-Interval", "1")
			st, err := c.WatchDir(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			// (Nothing changed yet: the start event came flushed.)
			if !st.Receive() || st.Msg().GetStart() == nil {
				t.Fatalf("first: %v %v", st.Msg(), st.Err())
			}
			if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			next := func(want fspb.EventType, name string) *fspb.FilesystemEvent {
				t.Helper()
				for st.Receive() {
					if fe := st.Msg().GetFilesystem(); fe != nil && fe.GetType() == want && fe.GetName() == name {
						return fe
					}
				}
				t.Fatalf("waiting for %v %s: %v", want, name, st.Err())
				return nil
			}
			next(fspb.EventType_EVENT_TYPE_CREATE, "sub")
			time.Sleep(100 * time.Millisecond) // (the agent adds sub's watch)
			if err := os.WriteFile(filepath.Join(dir, "sub", "f"), []byte("data"), 0o600); err != nil {
				t.Fatal(err)
			}
			fe := next(fspb.EventType_EVENT_TYPE_CREATE, "sub/f")
			if e := fe.GetEntry(); e.GetPath() != filepath.Join(dir, "sub", "f") || e.GetType() != fspb.FileType_FILE_TYPE_FILE || e.GetPermissions() != "-rw-------" {
				t.Errorf("the entry of a created file: %v", e)
			}
			if err := os.Remove(filepath.Join(dir, "sub", "f")); err != nil {
				t.Fatal(err)
			}
			if fe := next(fspb.EventType_EVENT_TYPE_REMOVE, "sub/f"); fe.Entry != nil {
				t.Errorf("a removed file's entry: %v", fe.Entry)
			}
			// Quiet for over a second: a keepalive.
			if !st.Receive() || st.Msg().GetKeepalive() == nil {
				t.Errorf("after a quiet second: %v %v", st.Msg(), st.Err())
			}

			// Polled: the events since the last fetch, then removed.
			w, err := c.CreateWatcher(ctx, as(&fspb.CreateWatcherRequest{Path: dir}, "tok", ""))
			if err != nil {
				t.Fatal(err)
			}
			wid := w.Msg.GetWatcherId()
			os.WriteFile(filepath.Join(dir, "g"), nil, 0o644)
			var got []string
			for deadline := time.Now().Add(10 * time.Second); len(got) == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				r, err := c.GetWatcherEvents(ctx, as(&fspb.GetWatcherEventsRequest{WatcherId: wid}, "tok", ""))
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range r.Msg.GetEvents() {
					got = append(got, e.GetType().String()+" "+e.GetName())
				}
			}
			if len(got) == 0 || got[0] != "EVENT_TYPE_CREATE g" {
				t.Errorf("polled: %v", got)
			}
			if _, err := c.RemoveWatcher(ctx, as(&fspb.RemoveWatcherRequest{WatcherId: wid}, "tok", "")); err != nil {
				t.Error(err)
			}
			if _, err := c.GetWatcherEvents(ctx, as(&fspb.GetWatcherEventsRequest{WatcherId: wid}, "tok", "")); code(err) != connect.CodeNotFound {
				t.Errorf("a removed watcher: %v", err)
			}

			// A missing directory, or a file: refused before the start.
			for what, p := range map[string]string{"missing": filepath.Join(dir, "nothing"), "a file": filepath.Join(dir, "g")} {
				st, err := c.WatchDir(ctx, as(&fspb.WatchDirRequest{Path: p}, "tok", ""))
				if err == nil {
					if st.Receive() {
						t.Errorf("watch %s: %v", what, st.Msg())
					}
					err = st.Err()
				}
				if code(err) != map[string]connect.Code{"missing": connect.CodeNotFound, "a file": connect.CodeFailedPrecondition}[what] {
					t.Errorf("watch %s: %v", what, err)
				}
			}
		})
	}

	// The sandbox's agent gone: the stream ends saying so.
	c := fsClient(t, s, ids[0], nil)
	st, err := c.WatchDir(ctx, as(&fspb.WatchDirRequest{Path: t.TempDir()}, "tok", ""))
	if err != nil || !st.Receive() || st.Msg().GetStart() == nil {
		t.Fatalf("watch: %v", err)
	}
	agent.Close()
	for st.Receive() {
	}
	if code(st.Err()) != connect.CodeUnavailable {
		t.Errorf("the agent gone: %v", st.Err())
	}
}

// fakeWatches is a watcher source a test drives: the service's bounds
// without a guest.
type fakeWatches struct {
	*harebox.Engine
	mu      sync.Mutex
	watches []*fakeWatch
}

type fakeWatch struct {
	events chan sandbox.FileEvent
	fail   chan error
	closed chan struct{}
	once   sync.Once
}

func (f *fakeWatches) WatchDir(_ context.Context, _, path string, _ bool) (sandbox.Watcher, error) {
	w := &fakeWatch{events: make(chan sandbox.FileEvent), fail: make(chan error, 1), closed: make(chan struct{})}
	f.mu.Lock()
	f.watches = append(f.watches, w)
	f.mu.Unlock()
	return w, nil
}

func (f *fakeWatches) last() *fakeWatch {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.watches[len(f.watches)-1]
}

func (w *fakeWatch) Next() (sandbox.FileEvent, error) {
	select {
	case ev := <-w.events:
		return ev, nil
	case err := <-w.fail:
		return sandbox.FileEvent{}, err
	case <-w.closed:
		return sandbox.FileEvent{}, context.Canceled
	}
}

func (w *fakeWatch) Close() { w.once.Do(func() { close(w.closed) }) }

func (w *fakeWatch) isClosed() bool {
	select {
	case <-w.closed:
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

// The service's own bounds: watches per sandbox, queued events, idle
// watchers, events the sandbox dropped, watchers of another sandbox.
func TestWatchBounds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eng, ids, account := memEngine(t, 2)
	a, b := ids[0], ids[1]
	src := &fakeWatches{Engine: eng}
	s := envd.New(envd.Options{Files: eng, Filesystem: src, Access: sandboxes{tokens: map[string]string{a: "tok-a", b: "tok-b"}, account: account}})
	ca, cb := fsClient(t, s, a, nil), fsClient(t, s, b, nil)
	create := func(c filesystemconnect.FilesystemClient, tok string) (string, error) {
		r, err := c.CreateWatcher(ctx, as(&fspb.CreateWatcherRequest{Path: "/tmp"}, tok, ""))
		if err != nil {
			return "", err
		}
		return r.Msg.GetWatcherId(), nil
	}
	events := func(c filesystemconnect.FilesystemClient, tok, wid string) ([]*fspb.FilesystemEvent, error) {
		r, err := c.GetWatcherEvents(ctx, as(&fspb.GetWatcherEventsRequest{WatcherId: wid}, tok, ""))
		if err != nil {
			return nil, err
		}
		return r.Msg.GetEvents(), nil
	}

	// At most MaxWatches of a sandbox's at once, polled and streamed.
	var wids []string
	for range envd.MaxWatches {
		wid, err := create(ca, "tok-a")
		if err != nil {
			t.Fatal(err)
		}
		wids = append(wids, wid)
	}
	if _, err := create(ca, "tok-a"); code(err) != connect.CodeResourceExhausted {
		t.Errorf("one watcher too many: %v", err)
	}
	st, err := ca.WatchDir(ctx, as(&fspb.WatchDirRequest{Path: "/tmp"}, "tok-a", ""))
	if err == nil {
		if st.Receive() {
			t.Errorf("one stream too many started")
		}
		err = st.Err()
	}
	if code(err) != connect.CodeResourceExhausted {
		t.Errorf("one stream too many: %v", err)
	}
	// Another sandbox has its own, and sees none of A's.
	wb, err := create(cb, "tok-b")
	if err != nil {
		t.Errorf("another sandbox's watcher: %v", err)
	}
	if _, err := events(cb, "tok-b", wids[0]); code(err) != connect.CodeNotFound {
		t.Errorf("another sandbox's watcher's events: %v", err)
	}
	if _, err := cb.RemoveWatcher(ctx, as(&fspb.RemoveWatcherRequest{WatcherId: wids[0]}, "tok-b", "")); code(err) != connect.CodeNotFound {
		t.Errorf("remove another sandbox's watcher: %v", err)
	}
	if _, err := events(ca, "tok-a", wb); code(err) != connect.CodeNotFound {
		t.Errorf("B's watcher from A: %v", err)
	}
	if _, err := ca.RemoveWatcher(ctx, as(&fspb.RemoveWatcherRequest{WatcherId: wids[0]}, "tok-a", "")); err != nil {
		t.Fatal(err)
	}
	wid, err := create(ca, "tok-a")
	if err != nil {
		t.Fatalf("a watcher after one was removed: %v", err)
	}
	w := src.last()

	// Queued events: all of them fetched in order; one past the bound
	// ends the watch, said once they are fetched, then it is gone.
	for i := range envd.MaxQueuedEvents + 1 {
		w.events <- sandbox.FileEvent{Path: fmt.Sprintf("/tmp/f%d", i), Op: "write"}
	}
	if !w.isClosed() {
		t.Fatal("an overflowing watch was not closed")
	}
	got, err := events(ca, "tok-a", wid)
	if err != nil || len(got) != envd.MaxQueuedEvents || got[0].GetName() != "f0" || got[0].GetType() != fspb.EventType_EVENT_TYPE_WRITE || got[len(got)-1].GetName() != fmt.Sprintf("f%d", envd.MaxQueuedEvents-1) {
		t.Fatalf("queued: %d %v", len(got), err)
	}
	if _, err := events(ca, "tok-a", wid); code(err) != connect.CodeResourceExhausted {
		t.Errorf("after an overflow: %v", err)
	}
	if _, err := events(ca, "tok-a", wid); code(err) != connect.CodeNotFound {
		t.Errorf("an overflowed watcher is still there: %v", err)
	}

	// Events the sandbox dropped end the watch too, and so does the
	// sandbox going (its agent's connection: unavailable).
	for _, c := range []struct {
		what string
		do   func(*fakeWatch)
		want connect.Code
	}{
		{"dropped", func(w *fakeWatch) { w.events <- sandbox.FileEvent{Path: "/tmp/x", Op: "create", Dropped: 3} }, connect.CodeResourceExhausted},
		{"the sandbox gone", func(w *fakeWatch) { w.fail <- model.Errorf(model.ErrUnavailable, "", "the agent went") }, connect.CodeUnavailable},
	} {
		wid, err := create(ca, "tok-a")
		if err != nil {
			t.Fatal(err)
		}
		w := src.last()
		c.do(w)
		if !w.isClosed() {
			t.Fatalf("%s: not closed", c.what)
		}
		if _, err := events(ca, "tok-a", wid); code(err) != c.want {
			t.Errorf("%s: %v", c.what, err)
		}
	}

	// A watcher no one fetches from is dropped, its watch closed.
	defer envd.SetWatcherIdle(200 * time.Millisecond)()
	wid, err = create(ca, "tok-a")
	if err != nil {
		t.Fatal(err)
	}
	w = src.last()
	for range 3 { // fetching keeps it
		time.Sleep(100 * time.Millisecond)
		if _, err := events(ca, "tok-a", wid); err != nil {
			t.Fatalf("a watcher fetched from: %v", err)
		}
	}
	if !w.isClosed() {
		t.Fatal("an idle watcher was not dropped")
	}
	if _, err := events(ca, "tok-a", wid); code(err) != connect.CodeNotFound {
		t.Errorf("an idle watcher: %v", err)
	}
	// Every slot is free again (the first MaxWatches-1 are held still).
	for _, wid := range wids[1:] {
		if _, err := ca.RemoveWatcher(ctx, as(&fspb.RemoveWatcherRequest{WatcherId: wid}, "tok-a", "")); err != nil {
			t.Fatal(err)
		}
	}
	for range envd.MaxWatches {
		if _, err := create(ca, "tok-a"); err != nil {
			t.Fatalf("slots after the watchers went: %v", err)
		}
	}
}
