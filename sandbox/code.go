package sandbox

import (
	"encoding/json"
	"regexp"
	"time"
)

// The code interpreter (images' code-interpreter, package codeinterp):
// cells of code run in a context, one kernel each, whose state lasts
// from one cell to the next.

// Code interpreter bounds and defaults.
const (
	// DefaultCodeTimeout applies when a request gives none.
	DefaultCodeTimeout = 5 * time.Minute
	// MaxCodeBytes bounds a cell's code.
	MaxCodeBytes = 1 << 20
)

// The languages a context runs.
const (
	LangPython     = "python"
	LangBash       = "bash"
	LangJavaScript = "javascript"
	LangTypeScript = "typescript"
)

// CodeLanguages are the languages above, for a check of a context's
// (the requests' validate tags below name the same).
var CodeLanguages = []string{LangPython, LangBash, LangJavaScript, LangTypeScript}

// DefaultCodeContext is the ID of language's default context.
func DefaultCodeContext(language string) string {
	switch language {
	case LangBash, LangJavaScript, LangTypeScript:
		return "default-" + language
	}
	return "default"
}

var codeContextRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// CodeRequest is a cell to run.
type CodeRequest struct {
	Code string `json:"code" validate:"required,max=1048576"`
	// ContextID is the context it runs in; without it, the default
	// context of Language (python's is "default").
	ContextID string `json:"context_id,omitempty"`
	// Language is python (the default), javascript, typescript or bash.
	Language string `json:"language,omitempty" validate:"omitempty,oneof=python bash javascript typescript"`
	// Env holds variables for this cell (over the sandbox's own).
	Env map[string]string `json:"env,omitempty" validate:"max=128,dive,keys,envname,endkeys,max=32768"`
	// TimeoutSeconds interrupts the cell (the context stays usable); 0
	// means DefaultCodeTimeout.
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty" validate:"gte=0,lte=3600"`
}

// Check validates the request.
func (r *CodeRequest) Check() error {
	if err := Validate(r); err != nil {
		return err
	}
	return checkContextID(r.ContextID)
}

// Timeout is the effective timeout.
func (r *CodeRequest) Timeout() time.Duration {
	if r.TimeoutSeconds <= 0 {
		return DefaultCodeTimeout
	}
	return time.Duration(r.TimeoutSeconds * float64(time.Second))
}

// checkContextID validates a context ID given in a request.
func checkContextID(id string) error {
	if id != "" && !codeContextRE.MatchString(id) {
		return Errorf(ErrInvalid, "context_id", "a context ID is 1 to 64 of [a-z0-9-]")
	}
	return nil
}

// CheckCodeContextID validates a context ID given in a path.
func CheckCodeContextID(id string) error {
	if id == "" {
		return Errorf(ErrInvalid, "context_id", "a context ID is required")
	}
	return checkContextID(id)
}

// CodeContextRequest makes a context.
type CodeContextRequest struct {
	// Language is python (the default), javascript, typescript or bash.
	Language string `json:"language,omitempty" validate:"omitempty,oneof=python bash javascript typescript"`
	// Cwd is where its code runs (default the user's home).
	Cwd string            `json:"cwd,omitempty" validate:"omitempty,max=4096,startswith=/"`
	Env map[string]string `json:"env,omitempty" validate:"max=128,dive,keys,envname,endkeys,max=32768"`
}

// Check validates the request.
func (r *CodeContextRequest) Check() error { return Validate(r) }

// CodeContext is one kernel and its state.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// CodeResult is one rich result of a cell: its final expression's value
// (IsMainResult) or something it displayed, in each of the formats the
// kernel gave. Images are base64; HTML, SVG and the rest are the guest's
// own text, never rendered by the host.
type CodeResult struct {
	IsMainResult bool            `json:"is_main_result"`
	Text         string          `json:"text,omitempty"`
	HTML         string          `json:"html,omitempty"`
	Markdown     string          `json:"markdown,omitempty"`
	SVG          string          `json:"svg,omitempty"`
	PNG          string          `json:"png,omitempty"`
	JPEG         string          `json:"jpeg,omitempty"`
	LaTeX        string          `json:"latex,omitempty"`
	JSON         json.RawMessage `json:"json,omitempty"`
	// Chart is what a Matplotlib figure draws, as data (its type, title,
	// axes and elements), in the shape E2B's SDKs call a result's chart.
	Chart json.RawMessage `json:"chart,omitempty"`
	// Width and Height are the PNG's (else the JPEG's) in pixels.
	Width  int `json:"width,omitempty"`
	Height int `json:"height,omitempty"`
}

// CodeError is the exception a cell raised (or, for bash, its non-zero
// exit status; a timeout and a dead kernel are errors too).
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback,omitempty"`
}

// Statuses a cell ends with.
const (
	CodeOK      = "ok"
	CodeFailed  = "error"
	CodeTimeout = "timeout"
	// CodeDied: the kernel died; the context answers so until restarted.
	CodeDied = "died"
)

// CodeEvent is one thing a running cell produced, as it comes: Type is
// stdout or stderr (Text), result (Result) or error (Error).
type CodeEvent struct {
	Type   string      `json:"type"`
	Text   string      `json:"text,omitempty"`
	Result *CodeResult `json:"result,omitempty"`
	Error  *CodeError  `json:"error,omitempty"`
}

// CodeExecution is a finished cell.
type CodeExecution struct {
	ContextID      string       `json:"context_id"`
	ExecutionCount int          `json:"execution_count"`
	Status         string       `json:"status"`
	Stdout         string       `json:"stdout"`
	Stderr         string       `json:"stderr"`
	Results        []CodeResult `json:"results"`
	Error          *CodeError   `json:"error,omitempty"`
	DurationMS     int64        `json:"duration_ms"`
	// StdoutTruncated and StderrTruncated say output beyond the engine's
	// cap was dropped; ResultsDropped counts results beyond its cap, or
	// with nothing in a format it keeps.
	StdoutTruncated bool `json:"stdout_truncated"`
	StderrTruncated bool `json:"stderr_truncated"`
	ResultsDropped  int  `json:"results_dropped,omitempty"`
}
