package guest

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
)

func writeFile(ctx context.Context, c agentpb.AgentClient, h *agentpb.WriteFileHeader, chunks ...[]byte) (*agentpb.FileInfo, error) {
	s, err := c.WriteFile(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.Send(&agentpb.WriteFileRequest{Msg: &agentpb.WriteFileRequest_Header{Header: h}}); err != nil {
		return s.CloseAndRecv()
	}
	for _, b := range chunks {
		if err := s.Send(&agentpb.WriteFileRequest{Msg: &agentpb.WriteFileRequest_Data{Data: b}}); err != nil {
			return s.CloseAndRecv()
		}
	}
	return s.CloseAndRecv()
}

func readFile(ctx context.Context, c agentpb.AgentClient, req *agentpb.ReadFileRequest) ([]byte, error) {
	s, err := c.ReadFile(ctx, req)
	if err != nil {
		return nil, err
	}
	var out []byte
	for {
		ch, err := s.Recv()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if len(ch.Data) > readChunk {
			return nil, io.ErrShortBuffer
		}
		out = append(out, ch.Data...)
	}
}

func TestWriteReadFile(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	dir := filepath.Join(e.root, "data")
	mustMkdir(t, dir)
	p := filepath.Join(dir, "f.bin")

	big := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320000 bytes
	info, err := writeFile(ctx, e.client, &agentpb.WriteFileHeader{Path: p, Mode: 0o600, Owner: "root"}, big[:100000], big[100000:])
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(len(big)) || info.Mode != 0o600 || info.Type != agentpb.FileType_FILE_TYPE_REGULAR || info.Uid != 0 || info.Path != p || info.Name != "f.bin" {
		t.Fatalf("info = %+v", info)
	}
	got, err := readFile(ctx, e.client, &agentpb.ReadFileRequest{Path: p})
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}
	got, err = readFile(ctx, e.client, &agentpb.ReadFileRequest{Path: p, Offset: 16*1000 + 3, Limit: 5})
	if err != nil || string(got) != "34567" {
		t.Fatalf("offset/limit read %q, %v", got, err)
	}

	// Replacing is a rename: a reader holding the old file keeps it whole.
	old, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := writeFile(ctx, e.client, &agentpb.WriteFileHeader{Path: p}, []byte("new\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(old); !bytes.Equal(b, big) {
		t.Fatal("old file changed in place")
	}
	fi, _ := os.Stat(p)
	if b, _ := os.ReadFile(p); string(b) != "new\n" || fi.Mode().Perm() != 0o644 {
		t.Fatalf("replaced file %q mode %v", b, fi.Mode())
	}
	// Default owner is the default user.
	if info, _ := e.client.Stat(ctx, &agentpb.PathRequest{Path: p}); info.Uid != 1000 || info.Gid != 1000 {
		t.Fatalf("default owner %d:%d", info.Uid, info.Gid)
	}

	// Append writes in place and keeps the mode.
	if _, err := writeFile(ctx, e.client, &agentpb.WriteFileHeader{Path: p, Append: true}, []byte("more\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "new\nmore\n" {
		t.Fatalf("after append %q", b)
	}
	// Append creates a missing file.
	ap := filepath.Join(dir, "log")
	if info, err := writeFile(ctx, e.client, &agentpb.WriteFileHeader{Path: ap, Append: true, Mode: 0o640}, []byte("a")); err != nil || info.Mode != 0o640 {
		t.Fatalf("append create: %+v, %v", info, err)
	}

	// Make parents: new directories owned like the file.
	deep := filepath.Join(dir, "a/b/c/f.txt")
	if _, err := writeFile(ctx, e.client, &agentpb.WriteFileHeader{Path: deep}, []byte("x")); status.Code(err) != codes.NotFound {
		t.Fatalf("missing parent: %v", err)
	}
	info, err = writeFile(ctx, e.client, &agentpb.WriteFileHeader{Path: deep, MakeParents: true, Owner: "65534", Mode: 0o4755})
	if err != nil || info.Uid != 65534 || info.Mode != 0o4755 || info.Size != 0 {
		t.Fatalf("make parents: %+v, %v", info, err)
	}
	if info, _ := e.client.Stat(ctx, &agentpb.PathRequest{Path: filepath.Join(dir, "a/b")}); info.Uid != 65534 || info.Type != agentpb.FileType_FILE_TYPE_DIRECTORY || info.Mode != 0o755 {
		t.Fatalf("parent = %+v", info)
	}

	// No temp files are left behind.
	for _, d := range []string{dir, filepath.Dir(deep)} {
		ents, _ := os.ReadDir(d)
		for _, de := range ents {
			if strings.HasPrefix(de.Name(), ".") {
				t.Errorf("left behind: %s", filepath.Join(d, de.Name()))
			}
		}
	}

	// Errors.
	_, err = readFile(ctx, e.client, &agentpb.ReadFileRequest{Path: dir})
	wantCode(t, err, codes.FailedPrecondition)
	_, err = readFile(ctx, e.client, &agentpb.ReadFileRequest{Path: filepath.Join(dir, "absent")})
	wantCode(t, err, codes.NotFound)
	_, err = writeFile(ctx, e.client, &agentpb.WriteFileHeader{Path: dir}, []byte("x"))
	wantCode(t, err, codes.FailedPrecondition)
	_, err = writeFile(ctx, e.client, &agentpb.WriteFileHeader{Path: p, Owner: "nosuchuser"})
	wantCode(t, err, codes.InvalidArgument)
	_, err = writeFile(ctx, e.client, &agentpb.WriteFileHeader{Path: p, Mode: 0o10000})
	wantCode(t, err, codes.InvalidArgument)
}

func TestBadPaths(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	for _, p := range []string{"", "relative/x", "/a/../b", "/a/", "/a//b", "/a/\x00b", "/" + strings.Repeat("a", 5000)} {
		_, err := writeFile(ctx, e.client, &agentpb.WriteFileHeader{Path: p}, []byte("x"))
		wantCode(t, err, codes.InvalidArgument)
		_, err = readFile(ctx, e.client, &agentpb.ReadFileRequest{Path: p})
		wantCode(t, err, codes.InvalidArgument)
		_, err = e.client.Stat(ctx, &agentpb.PathRequest{Path: p})
		wantCode(t, err, codes.InvalidArgument)
		_, err = e.client.Mkdir(ctx, &agentpb.MkdirRequest{Path: p})
		wantCode(t, err, codes.InvalidArgument)
		_, err = e.client.Remove(ctx, &agentpb.RemoveRequest{Path: p})
		wantCode(t, err, codes.InvalidArgument)
	}
	// The header must come first.
	s, err := e.client.WriteFile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&agentpb.WriteFileRequest{Msg: &agentpb.WriteFileRequest_Data{Data: []byte("x")}})
	_, err = s.CloseAndRecv()
	wantCode(t, err, codes.InvalidArgument)
	_, err = readFile(ctx, e.client, &agentpb.ReadFileRequest{Path: "/etc/hostname", Offset: -1})
	wantCode(t, err, codes.InvalidArgument)
}

func TestStatListMkdirRemove(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	dir := filepath.Join(e.root, "tree")

	info, err := e.client.Mkdir(ctx, &agentpb.MkdirRequest{Path: filepath.Join(dir, "x/y"), Mode: 0o750, Owner: "user"})
	if err != nil || info.Mode != 0o750 || info.Uid != 1000 || info.Type != agentpb.FileType_FILE_TYPE_DIRECTORY {
		t.Fatalf("mkdir: %+v, %v", info, err)
	}
	// mkdir -p of an existing directory succeeds.
	if _, err := e.client.Mkdir(ctx, &agentpb.MkdirRequest{Path: filepath.Join(dir, "x")}); err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, filepath.Join(dir, "file"), "12345")
	_, err = e.client.Mkdir(ctx, &agentpb.MkdirRequest{Path: filepath.Join(dir, "file")})
	wantCode(t, err, codes.AlreadyExists)
	if err := os.Symlink("file", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}

	info, err = e.client.Stat(ctx, &agentpb.PathRequest{Path: filepath.Join(dir, "link")})
	if err != nil || info.Type != agentpb.FileType_FILE_TYPE_SYMLINK || info.LinkTarget != "file" {
		t.Fatalf("stat link: %+v, %v", info, err)
	}
	_, err = e.client.Stat(ctx, &agentpb.PathRequest{Path: filepath.Join(dir, "absent")})
	wantCode(t, err, codes.NotFound)

	list, err := e.client.ListDir(ctx, &agentpb.ListDirRequest{Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, en := range list.Entries {
		names = append(names, en.Name)
	}
	if strings.Join(names, ",") != "file,link,x" || list.Truncated || list.Entries[0].Size != 5 || list.Entries[0].Path != filepath.Join(dir, "file") {
		t.Fatalf("list = %v truncated=%v", names, list.Truncated)
	}
	list, err = e.client.ListDir(ctx, &agentpb.ListDirRequest{Path: dir, Limit: 2})
	if err != nil || len(list.Entries) != 2 || !list.Truncated {
		t.Fatalf("limited list: %v, %v", list, err)
	}
	_, err = e.client.ListDir(ctx, &agentpb.ListDirRequest{Path: filepath.Join(dir, "file")})
	wantCode(t, err, codes.FailedPrecondition)

	// chmod and chown.
	if _, err := e.client.Chmod(ctx, &agentpb.ChmodRequest{Path: filepath.Join(dir, "file"), Mode: 0o2711}); err != nil {
		t.Fatal(err)
	}
	if info, _ := e.client.Stat(ctx, &agentpb.PathRequest{Path: filepath.Join(dir, "file")}); info.Mode != 0o2711 {
		t.Fatalf("chmod: mode %o", info.Mode)
	}
	_, err = e.client.Chmod(ctx, &agentpb.ChmodRequest{Path: filepath.Join(dir, "file"), Mode: 0o170000})
	wantCode(t, err, codes.InvalidArgument)
	for _, c := range []struct {
		owner    string
		uid, gid uint32
	}{{"65534", 65534, 65534}, {"nobody:user", 65534, 1000}, {"1234:5678", 1234, 5678}, {"root:extra", 0, 2000}} {
		if _, err := e.client.Chown(ctx, &agentpb.ChownRequest{Path: filepath.Join(dir, "file"), Owner: c.owner}); err != nil {
			t.Fatalf("chown %s: %v", c.owner, err)
		}
		if info, _ := e.client.Stat(ctx, &agentpb.PathRequest{Path: filepath.Join(dir, "file")}); info.Uid != c.uid || info.Gid != c.gid {
			t.Fatalf("chown %s: %d:%d", c.owner, info.Uid, info.Gid)
		}
	}
	for _, bad := range []string{"", "nosuch", "user:nosuch", ":1"} {
		_, err = e.client.Chown(ctx, &agentpb.ChownRequest{Path: filepath.Join(dir, "file"), Owner: bad})
		wantCode(t, err, codes.InvalidArgument)
	}
	_, err = e.client.Chown(ctx, &agentpb.ChownRequest{Path: filepath.Join(dir, "absent"), Owner: "root"})
	wantCode(t, err, codes.NotFound)

	// remove.
	_, err = e.client.Remove(ctx, &agentpb.RemoveRequest{Path: "/", Recursive: true})
	wantCode(t, err, codes.InvalidArgument)
	_, err = e.client.Remove(ctx, &agentpb.RemoveRequest{Path: filepath.Join(dir, "x")})
	wantCode(t, err, codes.FailedPrecondition) // not empty
	if _, err := e.client.Remove(ctx, &agentpb.RemoveRequest{Path: filepath.Join(dir, "link")}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "file")); err != nil {
		t.Fatal("removing the link removed its target")
	}
	if _, err := e.client.Remove(ctx, &agentpb.RemoveRequest{Path: dir, Recursive: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("tree still there: %v", err)
	}
	_, err = e.client.Remove(ctx, &agentpb.RemoveRequest{Path: dir, Recursive: true})
	wantCode(t, err, codes.NotFound)
}

// A write the client abandons leaves neither the file nor a temp file.
func TestWriteFileCancelled(t *testing.T) {
	e := newEnv(t)
	dir := filepath.Join(e.root, "cancel")
	mustMkdir(t, dir)
	ctx, cancel := context.WithCancel(testCtx(t))
	s, err := e.client.WriteFile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Send(&agentpb.WriteFileRequest{Msg: &agentpb.WriteFileRequest_Header{Header: &agentpb.WriteFileHeader{Path: filepath.Join(dir, "f")}}})
	s.Send(&agentpb.WriteFileRequest{Msg: &agentpb.WriteFileRequest_Data{Data: []byte("partial")}})
	// Wait for the temp file to exist, so the cancel hits a write in progress.
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(10 * time.Millisecond) {
		if ents, _ := os.ReadDir(dir); len(ents) > 0 {
			break
		}
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ents, _ := os.ReadDir(dir)
		if len(ents) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left after cancel: %v", ents)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
