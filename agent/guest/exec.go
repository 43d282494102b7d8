package guest

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
)

const (
	// execChunk bounds one stdout/stderr message.
	execChunk = 32 << 10
	// After the process exits, output still buffered in the pipes is sent;
	// a pipe that stays quiet this long (a background child holds it open)
	// is given up on, and drainMax caps the whole drain.
	drainIdle = 200 * time.Millisecond
	drainMax  = 10 * time.Second

	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// exitStartFailed is the exit code reported with Exit.error, as a shell
	// reports a command it could not run.
	exitStartFailed = 127
)

// Exec runs one process and streams its output; see agent.proto.
func (s *Server) Exec(stream agentpb.Agent_ExecServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "the first exec message must be start")
	}
	if err := validateStart(start); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	e := &execution{s: s, stream: stream, req: start, began: time.Now()}
	return e.run()
}

func validateStart(st *agentpb.ExecStart) error {
	if (len(st.GetArgv()) > 0) == (st.GetShell() != "") {
		return errors.New("exactly one of argv and shell must be set")
	}
	if len(st.GetArgv()) > 0 && st.GetArgv()[0] == "" {
		return errors.New("argv[0] is empty")
	}
	for _, a := range st.GetArgv() {
		if strings.IndexByte(a, 0) >= 0 {
			return errors.New("argv contains NUL")
		}
	}
	for _, kv := range st.GetEnv() {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.IndexByte(kv, 0) >= 0 {
			return fmt.Errorf("env entry %q is not KEY=VALUE", kv)
		}
	}
	if strings.IndexByte(st.GetShell(), 0) >= 0 || strings.IndexByte(st.GetUser(), 0) >= 0 ||
		strings.IndexByte(st.GetCwd(), 0) >= 0 {
		return errors.New("shell, user or cwd contains NUL")
	}
	if st.GetCwd() != "" && !filepath.IsAbs(st.GetCwd()) {
		return errors.New("cwd must be absolute")
	}
	if st.GetTimeoutMs() < 0 {
		return errors.New("timeout_ms must not be negative")
	}
	return nil
}

// execution is one running Exec call.
type execution struct {
	s      *Server
	stream agentpb.Agent_ExecServer
	req    *agentpb.ExecStart
	began  time.Time

	sendMu sync.Mutex // gRPC streams allow one sender at a time

	cmd        *exec.Cmd
	pgid       int
	outputs    []output   // read ends we stream from
	childFiles []*os.File // the child's ends, closed once it started
	pty        *os.File   // pty master, nil without a pty

	stdinMu sync.Mutex
	stdin   *os.File // nil when stdin is disabled or closed

	exited     atomic.Bool // the process was reaped: its pgid may be reused
	drainUntil time.Time   // set before exitedCh closes
	exitedCh   chan struct{}
}

type output struct {
	f      *os.File
	stderr bool
}

func (e *execution) run() error {
	defer e.closeAll()
	unboost()
	if err := e.prepare(); err != nil {
		return e.sendExit(&agentpb.ExecExit{ExitCode: exitStartFailed, Error: err.Error()})
	}
	err := e.cmd.Start()
	for _, f := range e.childFiles {
		f.Close()
	}
	if err != nil {
		code := int32(exitStartFailed)
		if errors.Is(err, fs.ErrPermission) {
			code = 126
		}
		return e.sendExit(&agentpb.ExecExit{ExitCode: code, Error: err.Error()})
	}
	e.pgid = e.cmd.Process.Pid
	// The agent is the OOM killer's last choice (its unit sets -900), and
	// a child inherits that: a job that eats the guest's memory would tie
	// with the agent. Commands go back to the default at once (before a
	// shell has had time to fork anything, though not atomically).
	os.WriteFile("/proc/"+strconv.Itoa(e.pgid)+"/oom_score_adj", []byte("0"), 0)
	e.exitedCh = make(chan struct{})

	var wg sync.WaitGroup
	for _, o := range e.outputs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.pump(o)
		}()
	}
	go e.recvLoop()

	sendErr := e.send(&agentpb.ExecResponse{Msg: &agentpb.ExecResponse_StartedPid{StartedPid: int32(e.pgid)}})
	if sendErr != nil {
		e.kill(unix.SIGKILL)
	}
	timedOut := e.wait()
	e.exited.Store(true)

	// Let the pumps send what the process wrote before it exited, without
	// waiting on background children that keep the pipes open.
	e.drainUntil = time.Now().Add(drainMax)
	close(e.exitedCh)
	for _, o := range e.outputs {
		o.f.SetReadDeadline(time.Now().Add(drainIdle))
	}
	wg.Wait()
	if sendErr != nil {
		return sendErr
	}
	return e.sendExit(exitInfo(e.cmd.ProcessState, timedOut))
}

// prepare resolves the user, environment, working directory and binary, and
// sets up stdio. Its errors are start failures, reported in Exit.error.
func (e *execution) prepare() error {
	acct, err := e.s.lookupUser(e.req.GetUser())
	if err != nil {
		return err
	}
	env := buildEnv(acct, e.req.GetEnv(), e.req.GetPty())
	argv := e.req.GetArgv()
	if e.req.GetShell() != "" {
		argv = []string{"/bin/sh", "-c", e.req.GetShell()}
	}
	cwd := e.req.GetCwd()
	if cwd == "" {
		cwd = "/"
		if fi, err := os.Stat(acct.Home); err == nil && fi.IsDir() {
			cwd = acct.Home
		}
	}
	path, err := lookPath(argv[0], envValue(env, "PATH"), cwd)
	if err != nil {
		return err
	}
	cmd := &exec.Cmd{
		Path: path,
		Args: argv,
		Env:  env,
		Dir:  cwd,
		SysProcAttr: &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: acct.UID, Gid: acct.GID, Groups: acct.Groups},
		},
	}
	e.cmd = cmd
	if e.req.GetPty() {
		return e.setupPTY(acct.UID)
	}
	return e.setupPipes()
}

func (e *execution) setupPipes() error {
	e.cmd.SysProcAttr.Setpgid = true
	for _, stderr := range []bool{false, true} {
		r, w, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("pipe: %w", err)
		}
		e.outputs = append(e.outputs, output{f: r, stderr: stderr})
		e.childFiles = append(e.childFiles, w)
		if stderr {
			e.cmd.Stderr = w
		} else {
			e.cmd.Stdout = w
		}
	}
	if e.req.GetStdin() {
		r, w, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("pipe: %w", err)
		}
		e.childFiles = append(e.childFiles, r)
		e.stdin = w
		e.cmd.Stdin = r
	}
	return nil
}

func (e *execution) setupPTY(uid uint32) error {
	master, slave, err := openPTY()
	if err != nil {
		return err
	}
	e.pty = master
	e.childFiles = append(e.childFiles, slave)
	// As login does: the user owns its terminal, so tools that reopen it
	// by name (script, screen) work.
	if err := control(slave, func(fd int) error { return unix.Fchown(fd, int(uid), -1) }); err != nil {
		return fmt.Errorf("chown pty: %w", err)
	}
	e.outputs = append(e.outputs, output{f: master})
	if e.req.GetStdin() {
		e.stdin = master
	}
	rows, cols := e.req.GetPtyRows(), e.req.GetPtyCols()
	if rows == 0 {
		rows = 24
	}
	if cols == 0 {
		cols = 80
	}
	if err := setWinsize(master, rows, cols); err != nil {
		return fmt.Errorf("set pty size: %w", err)
	}
	e.cmd.Stdin, e.cmd.Stdout, e.cmd.Stderr = slave, slave, slave
	// A new session with the pty as controlling terminal (child fd 0), so
	// job control and ^C work as in a login shell.
	e.cmd.SysProcAttr.Setsid = true
	e.cmd.SysProcAttr.Setctty = true
	e.cmd.SysProcAttr.Ctty = 0
	return nil
}

// wait waits for the process, killing its group on timeout or when the
// client goes away. It reports whether the timeout fired.
func (e *execution) wait() (timedOut bool) {
	done := make(chan struct{})
	go func() {
		e.cmd.Wait()
		close(done)
	}()
	var timeout <-chan time.Time
	if ms := e.req.GetTimeoutMs(); ms > 0 {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	cancelled := e.stream.Context().Done()
	for {
		select {
		case <-done:
			return timedOut
		case <-timeout:
			timedOut = true
			timeout = nil
			e.kill(unix.SIGKILL)
		case <-cancelled:
			cancelled = nil
			e.kill(unix.SIGKILL)
		}
	}
}

// kill signals the whole process group, and the process itself in case it
// left the group.
func (e *execution) kill(sig unix.Signal) {
	if e.exited.Load() {
		return
	}
	unix.Kill(-e.pgid, sig)
	e.cmd.Process.Signal(sig)
}

// pump streams one output until EOF (or EIO, a pty whose last user left),
// or until the drain after exit gives up.
func (e *execution) pump(o output) {
	buf := make([]byte, execChunk)
	for {
		select {
		case <-e.exitedCh:
			o.f.SetReadDeadline(minTime(time.Now().Add(drainIdle), e.drainUntil))
		default:
		}
		n, err := o.f.Read(buf)
		if n > 0 {
			// Send marshals before returning, so buf may be reused.
			msg := &agentpb.ExecResponse{Msg: &agentpb.ExecResponse_Stdout{Stdout: buf[:n]}}
			if o.stderr {
				msg.Msg = &agentpb.ExecResponse_Stderr{Stderr: buf[:n]}
			}
			if e.send(msg) != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// recvLoop applies stdin, signals and resizes from the client. It ends when
// the stream does: a half-close closes stdin, a cancel kills the group.
func (e *execution) recvLoop() {
	for {
		req, err := e.stream.Recv()
		if err == io.EOF {
			e.closeStdin()
			return
		}
		if err != nil {
			e.kill(unix.SIGKILL)
			return
		}
		switch m := req.GetMsg().(type) {
		case *agentpb.ExecRequest_Stdin:
			e.writeStdin(m.Stdin)
		case *agentpb.ExecRequest_StdinEof:
			if m.StdinEof {
				e.eofStdin()
			}
		case *agentpb.ExecRequest_Signal:
			if m.Signal > 0 && m.Signal <= 64 {
				e.kill(unix.Signal(m.Signal))
			}
		case *agentpb.ExecRequest_Resize:
			if e.pty != nil {
				setWinsize(e.pty, m.Resize.GetRows(), m.Resize.GetCols())
			}
		}
		// A second start, or stdin when disabled, is ignored.
	}
}

func (e *execution) writeStdin(b []byte) {
	e.stdinMu.Lock()
	f := e.stdin
	e.stdinMu.Unlock()
	if f == nil || len(b) == 0 {
		return
	}
	// Not under the lock: a write may block on a full pipe, and closing the
	// file from elsewhere must be able to interrupt it.
	if _, err := f.Write(b); err != nil {
		e.closeStdin()
	}
}

// eofStdin ends the input: closing the pipe, or ^D on a terminal.
func (e *execution) eofStdin() {
	if e.pty != nil {
		e.writeStdin([]byte{4})
		return
	}
	e.closeStdin()
}

func (e *execution) closeStdin() {
	e.stdinMu.Lock()
	defer e.stdinMu.Unlock()
	if e.stdin != nil && e.stdin != e.pty {
		e.stdin.Close()
	}
	e.stdin = nil
}

func (e *execution) closeAll() {
	e.closeStdin()
	for _, o := range e.outputs {
		o.f.Close()
	}
	for _, f := range e.childFiles {
		f.Close()
	}
}

func (e *execution) send(m *agentpb.ExecResponse) error {
	e.sendMu.Lock()
	defer e.sendMu.Unlock()
	return e.stream.Send(m)
}

func (e *execution) sendExit(x *agentpb.ExecExit) error {
	x.DurationMs = time.Since(e.began).Milliseconds()
	return e.send(&agentpb.ExecResponse{Msg: &agentpb.ExecResponse_Exit{Exit: x}})
}

func exitInfo(ps *os.ProcessState, timedOut bool) *agentpb.ExecExit {
	x := &agentpb.ExecExit{TimedOut: timedOut, ExitCode: -1}
	if ps == nil {
		return x
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		x.Signal = int32(ws.Signal())
		return x
	}
	x.ExitCode = int32(ps.ExitCode())
	return x
}

// buildEnv is a login-like default environment overlaid with the request's
// KEY=VALUE entries (later ones win).
func buildEnv(a account, extra []string, pty bool) []string {
	env := []string{
		"HOME=" + a.Home,
		"USER=" + a.Name,
		"LOGNAME=" + a.Name,
		"SHELL=" + a.Shell,
		"PATH=" + defaultPath,
	}
	if pty {
		env = append(env, "TERM=xterm-256color")
	}
	index := make(map[string]int, len(env)+len(extra))
	for i, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		index[k] = i
	}
	for _, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := index[k]; ok {
			env[i] = kv
			continue
		}
		index[k] = len(env)
		env = append(env, kv)
	}
	return env
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, _ := strings.Cut(kv, "="); k == key {
			return v
		}
	}
	return ""
}

// lookPath finds name in the child's PATH (not the agent's), as the child's
// shell would. Names with a slash are taken as they are, relative to cwd.
func lookPath(name, pathEnv, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			name = filepath.Join(cwd, name)
		}
		return name, nil
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: command not found", name)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
