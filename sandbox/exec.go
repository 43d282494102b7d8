package sandbox

import "time"

// DefaultExecTimeout applies when a request gives none.
const DefaultExecTimeout = 5 * time.Minute

// ExecRequest runs one command in a sandbox.
type ExecRequest struct {
	// Cmd is a shell string (run with /bin/sh -c); Argv runs a program
	// directly. Exactly one.
	Cmd  string   `json:"cmd,omitempty" validate:"max=131072"`
	Argv []string `json:"argv,omitempty" validate:"max=4096,dive,max=131072"`
	// TimeoutSeconds kills the command's whole process group; 0 means
	// DefaultExecTimeout.
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty" validate:"gte=0,lte=86400"`
	Env            map[string]string `json:"env,omitempty" validate:"max=128,dive,keys,envname,endkeys,max=32768"`
	Cwd            string            `json:"cwd,omitempty" validate:"max=4096"`
	// User is a user name or uid; default "user" (uid 1000), "root" for root.
	User string `json:"user,omitempty" validate:"max=64"`
	// Stdin is fed to the command (bytes; base64 in JSON).
	Stdin []byte `json:"stdin,omitempty"`
}

// Check validates the request.
func (r *ExecRequest) Check() error {
	if err := Validate(r); err != nil {
		return err
	}
	if (r.Cmd == "") == (len(r.Argv) == 0) {
		return Errorf(ErrInvalid, "cmd", "give exactly one of cmd and argv")
	}
	return nil
}

// Timeout is the effective timeout.
func (r *ExecRequest) Timeout() time.Duration {
	if r.TimeoutSeconds <= 0 {
		return DefaultExecTimeout
	}
	return time.Duration(r.TimeoutSeconds * float64(time.Second))
}

// ExecResult is a finished command.
type ExecResult struct {
	ExitCode int `json:"exit_code"`
	// Signal is the signal that killed the command, if any.
	Signal     int    `json:"signal,omitempty"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	DurationMS int64  `json:"duration_ms"`
	TimedOut   bool   `json:"timed_out"`
	// StdoutTruncated and StderrTruncated say that output beyond the
	// engine's cap was dropped.
	StdoutTruncated bool `json:"stdout_truncated"`
	StderrTruncated bool `json:"stderr_truncated"`
	// Error says why the command could not start (no such program, ...).
	Error string `json:"error,omitempty"`
}

// Process is a background command.
type Process struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandbox_id"`
	Cmd       string    `json:"cmd,omitempty"`
	Argv      []string  `json:"argv,omitempty"`
	PID       int       `json:"pid,omitempty"` // in the guest
	Running   bool      `json:"running"`
	StartedAt time.Time `json:"started_at"`
	// Tag, Env, Cwd, User and PTY are how it was started (Env only what
	// the start gave, not the sandbox's), as the host noted them: unknown
	// for a process the host did not start since it last restarted.
	Tag  string            `json:"tag,omitempty"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	User string            `json:"user,omitempty"`
	PTY  bool              `json:"pty,omitempty"`
	// Result is set once the process has exited.
	Result *ExecResult `json:"result,omitempty"`
}

// MaxProcessInput bounds the stdin bytes of one ProcessInput.
const MaxProcessInput = 1 << 20

// ProcessInput is what a running background process is given: stdin
// bytes, then with EOF their end (^D on a terminal), and Rows and Cols, a
// new terminal size. Its stdin must have been kept open at its start.
type ProcessInput struct {
	Stdin []byte `json:"stdin,omitempty" validate:"max=1048576"`
	EOF   bool   `json:"eof,omitempty"`
	Rows  uint16 `json:"rows,omitempty" validate:"lte=1000"`
	Cols  uint16 `json:"cols,omitempty" validate:"lte=1000"`
}

// Check validates the input.
func (in *ProcessInput) Check() error {
	if err := Validate(in); err != nil {
		return err
	}
	if (in.Rows == 0) != (in.Cols == 0) {
		return Errorf(ErrInvalid, "rows", "give both rows and cols, or neither")
	}
	if in.Stdin == nil && !in.EOF && in.Rows == 0 {
		return Errorf(ErrInvalid, "stdin", "give stdin, eof or a terminal size (rows and cols)")
	}
	return nil
}

// Command is one entry of a sandbox's command history: what ran, as whom,
// where, when, and how it ended, with its output (bounded, and dropped
// when the account's retention says so).
type Command struct {
	ID        string      `json:"id"`
	SandboxID string      `json:"sandbox_id"`
	Kind      string      `json:"kind"` // exec, stream, background, shell or code
	Cmd       string      `json:"cmd,omitempty"`
	Argv      []string    `json:"argv,omitempty"`
	User      string      `json:"user,omitempty"`
	Cwd       string      `json:"cwd,omitempty"`
	StartedAt time.Time   `json:"started_at"`
	EndedAt   time.Time   `json:"ended_at"`
	Result    *ExecResult `json:"result,omitempty"`
	// OutputPurged says the output is gone (retention, or never kept).
	OutputPurged bool `json:"output_purged"`
}

// FileInfo describes a file in a sandbox.
type FileInfo struct {
	Path       string    `json:"path"`
	Name       string    `json:"name"`
	Type       string    `json:"type"` // file, dir, symlink, other
	Size       int64     `json:"size"`
	Mode       uint32    `json:"mode"`
	UID        uint32    `json:"uid"`
	GID        uint32    `json:"gid"`
	ModTime    time.Time `json:"mtime"`
	LinkTarget string    `json:"link_target,omitempty"`
}

// WriteOptions tune WriteFile.
type WriteOptions struct {
	// Mode is the file's permission bits; 0 means 0644.
	Mode uint32
	// Owner is "user", "root" or "name:group"; empty means the default user.
	Owner string
	// MakeParents creates missing parent directories.
	MakeParents bool
}

// MaxListDepth bounds how deep a listing goes (ListFiles' depth), as the
// agent does.
const MaxListDepth = 64

// FileEvent is one change under a watched directory (WatchDir).
type FileEvent struct {
	// Path is the changed file's, below the watched directory.
	Path string
	// Op is create (also a name moved in), write, remove, rename (a name
	// moved away) or chmod.
	Op string
	// Dropped counts the events the sandbox dropped before this one (the
	// reader was too slow).
	Dropped uint64
}

// Watcher is a directory watch in place: Next waits for its next event
// and fails once the watch ends (Close, its context, the directory gone,
// the sandbox's agent gone).
type Watcher interface {
	Next() (FileEvent, error)
	Close()
}

// Terminal is an interactive session's terminal: its size at the start,
// and what changes it while the session runs.
type Terminal struct {
	Rows, Cols uint16
	// Resize delivers new sizes (rows, cols); Signals signals for the
	// session's process group. Either may be nil.
	Resize  <-chan [2]uint16
	Signals <-chan int
}
