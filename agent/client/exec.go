package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/sandbox"
)

// ExecRequest describes one process to run in the guest.
type ExecRequest struct {
	// Argv, or Shell (run with /bin/sh -c). Exactly one.
	Argv    []string
	Shell   string
	Env     map[string]string
	Cwd     string
	User    string
	Timeout time.Duration
	PTY     bool
	Rows    uint16
	Cols    uint16
	// KeepStdin, for Start only: stdin stays open for Input (protocol 4).
	KeepStdin bool
}

// ExitStatus is how a process ended.
type ExitStatus struct {
	ExitCode int           `json:"exit_code"`
	Signal   int           `json:"signal,omitempty"`
	TimedOut bool          `json:"timed_out"`
	Duration time.Duration `json:"duration"`
	// Error is set when the process could not start.
	Error string `json:"error,omitempty"`
}

// ExecResult is a finished process with its collected output.
type ExecResult struct {
	ExitStatus
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
}

// Result is r as the API shows it (sandbox.ExecResult): the one
// conversion, for the engine's execs and its background processes.
func (r ExecResult) Result() *sandbox.ExecResult {
	return &sandbox.ExecResult{
		ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut, Error: r.Error,
		Stdout: string(r.Stdout), Stderr: string(r.Stderr),
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated,
		DurationMS: r.Duration.Milliseconds(),
	}
}

// Exec runs a process and collects its output, keeping at most MaxOutput
// bytes of each stream (the rest is drained and dropped, and flagged).
func (c *Client) Exec(ctx context.Context, req ExecRequest, stdin io.Reader) (_ ExecResult, err error) {
	defer classify(&err)
	out, errw := NewCapBuffer(c.opts.MaxOutput), NewCapBuffer(c.opts.MaxOutput)
	st, err := c.ExecStream(ctx, req, ExecIO{Stdin: stdin, Stdout: out, Stderr: errw})
	return ExecResult{
		ExitStatus: st, Stdout: out.Bytes(), Stderr: errw.Bytes(),
		StdoutTruncated: out.Truncated(), StderrTruncated: errw.Truncated(),
	}, err
}

// ExecIO carries a streaming exec's standard streams. Signals and Resize,
// if set, are forwarded while the process runs.
type ExecIO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Signals        <-chan int
	Resize         <-chan [2]uint16 // rows, cols
	// Started, if set, is called with the guest pid once the process runs.
	Started func(pid int)
}

// ExecStream runs a process and delivers its output as it comes. It returns
// when the process has exited and all output has been written.
func (c *Client) ExecStream(ctx context.Context, req ExecRequest, eio ExecIO) (_ ExitStatus, err error) {
	defer classify(&err)
	start, err := req.proto()
	if err != nil {
		return ExitStatus{}, err
	}
	// The guest enforces the timeout; the host adds its own deadline on top
	// in case the guest does not.
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout+15*time.Second)
		defer cancel()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.Exec(ctx)
	if err != nil {
		return ExitStatus{}, c.wrap("exec", err)
	}
	start.Stdin = eio.Stdin != nil
	if err := stream.Send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Start{Start: start}}); err != nil {
		if err == io.EOF { // (the stream ended: Recv says how)
			if _, rerr := stream.Recv(); rerr != nil && rerr != io.EOF {
				err = rerr
			}
		}
		return ExitStatus{}, c.wrap("exec", err)
	}
	sendErr := make(chan error, 1)
	go func() { sendErr <- c.pumpStdin(ctx, stream, eio) }()

	var exit *agentpb.ExecExit
	started := false
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return ExitStatus{}, c.wrap("exec", err)
		}
		if exit != nil {
			return ExitStatus{}, fmt.Errorf("%w: exec: message after exit", ErrGuest)
		}
		switch m := r.Msg.(type) {
		case *agentpb.ExecResponse_StartedPid:
			if m.StartedPid <= 0 || started {
				return ExitStatus{}, fmt.Errorf("%w: exec: bad or repeated pid %d", ErrGuest, m.StartedPid)
			}
			started = true
			if eio.Started != nil {
				eio.Started(int(m.StartedPid))
			}
		case *agentpb.ExecResponse_Stdout:
			if err := writeChunk(eio.Stdout, m.Stdout); err != nil {
				return ExitStatus{}, err
			}
		case *agentpb.ExecResponse_Stderr:
			if err := writeChunk(eio.Stderr, m.Stderr); err != nil {
				return ExitStatus{}, err
			}
		case *agentpb.ExecResponse_Exit:
			if m.Exit == nil {
				return ExitStatus{}, fmt.Errorf("%w: exec: empty exit", ErrGuest)
			}
			exit = m.Exit
		default:
			return ExitStatus{}, fmt.Errorf("%w: exec: unknown message", ErrGuest)
		}
	}
	if exit == nil {
		return ExitStatus{}, fmt.Errorf("%w: exec: stream ended without an exit status", ErrGuest)
	}
	cancel()
	if err := <-sendErr; err != nil && !errors.Is(err, context.Canceled) {
		return ExitStatus{}, err
	}
	return exitStatus(exit)
}

// maxDurationMs bounds a reported run time (a year) so it fits a Duration.
const maxDurationMs = 365 * 24 * 3600 * 1000

func exitStatus(e *agentpb.ExecExit) (ExitStatus, error) {
	switch {
	case e.ExitCode < -1 || e.ExitCode > 255,
		e.Signal < 0 || e.Signal > 64,
		e.DurationMs < 0 || e.DurationMs > maxDurationMs,
		!printable(e.Error, 1024):
		return ExitStatus{}, fmt.Errorf("%w: exec: bad exit status", ErrGuest)
	}
	return ExitStatus{
		ExitCode: int(e.ExitCode), Signal: int(e.Signal), TimedOut: e.TimedOut,
		Duration: time.Duration(e.DurationMs) * time.Millisecond, Error: e.Error,
	}, nil
}

func writeChunk(w io.Writer, b []byte) error {
	if len(b) > MaxChunk {
		return fmt.Errorf("%w: exec: output chunk of %d bytes", ErrGuest, len(b))
	}
	if w == nil {
		return nil
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("exec: write output: %w", err)
	}
	return nil
}

// pumpStdin forwards stdin, signals and resizes until ctx is done.
func (c *Client) pumpStdin(ctx context.Context, stream agentpb.Agent_ExecClient, eio ExecIO) error {
	var chunks chan []byte
	var readErr chan error
	if eio.Stdin != nil {
		chunks, readErr = make(chan []byte), make(chan error, 1)
		go func() {
			for {
				buf := make([]byte, 32<<10)
				n, err := eio.Stdin.Read(buf)
				if n > 0 {
					select {
					case chunks <- buf[:n]:
					case <-ctx.Done():
						return
					}
				}
				if err != nil {
					readErr <- err
					return
				}
			}
		}()
	}
	send := func(r *agentpb.ExecRequest) error {
		if err := stream.Send(r); err != nil && err != io.EOF {
			return c.wrap("exec", err)
		}
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case b := <-chunks:
			if err := send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Stdin{Stdin: b}}); err != nil {
				return err
			}
		case err := <-readErr:
			readErr, chunks = nil, nil
			if err != io.EOF {
				return fmt.Errorf("exec: read stdin: %w", err)
			}
			if err := send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_StdinEof{StdinEof: true}}); err != nil {
				return err
			}
		case sig := <-eio.Signals:
			if err := send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Signal{Signal: int32(sig)}}); err != nil {
				return err
			}
		case rc := <-eio.Resize:
			if err := send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Resize{Resize: &agentpb.Resize{Rows: uint32(rc[0]), Cols: uint32(rc[1])}}}); err != nil {
				return err
			}
		}
	}
}

func (r ExecRequest) proto() (*agentpb.ExecStart, error) {
	if (len(r.Argv) == 0) == (r.Shell == "") {
		return nil, errors.New("exec: give exactly one of argv and shell")
	}
	if r.Timeout < 0 {
		return nil, errors.New("exec: negative timeout")
	}
	s := &agentpb.ExecStart{
		Argv: r.Argv, Shell: r.Shell, Cwd: r.Cwd, User: r.User,
		TimeoutMs: r.Timeout.Milliseconds(), Pty: r.PTY,
		PtyRows: uint32(r.Rows), PtyCols: uint32(r.Cols),
	}
	for k, v := range r.Env {
		s.Env = append(s.Env, k+"="+v)
	}
	return s, nil
}

// CapBuffer keeps the first max bytes written to it and drops the rest,
// remembering that it did. It is safe for concurrent use.
type CapBuffer struct {
	mu        sync.Mutex
	buf       []byte
	max       int
	truncated bool
}

// NewCapBuffer returns a buffer that keeps at most max bytes.
func NewCapBuffer(max int) *CapBuffer { return &CapBuffer{max: max} }

func (w *CapBuffer) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	room := w.max - len(w.buf)
	if room < len(b) {
		w.truncated = true
		if room > 0 {
			w.buf = append(w.buf, b[:room]...)
		}
		return len(b), nil
	}
	w.buf = append(w.buf, b...)
	return len(b), nil
}

// Bytes returns what was kept.
func (w *CapBuffer) Bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf
}

// Truncated reports whether anything was dropped.
func (w *CapBuffer) Truncated() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.truncated
}
