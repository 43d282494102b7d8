// Package move carries a sandbox from one host of a deployment to
// another, over the hosts' internal endpoint (mutual TLS): the source
// host asks the target whether it can take the sandbox (Check), sends
// the sandbox's hibernation files (Send: a tar stream of one flat
// directory, sealed under the sandbox's data key already) and its
// volumes' (SendVolume: each volume's files, sealed under its key), and
// once the
// store says the sandbox is the target's, has the target take it up
// (Adopt). Package move/mover does the rest, on both hosts.
//
// The target treats everything it receives as another host's word, but
// bounded all the same: file names, file kinds and the total size are
// checked, and a stalled sender is cut.
package move

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
)

// Prefix is where the internal endpoint serves moves.
const Prefix = "/internal/v1/moves/"

// Check is what the source host asks the target before anything moves.
type Check struct {
	// Image is the image build the sandbox runs (its directory, which the
	// target must have at the same path) and Manifest the SHA-256 of that
	// build's manifest (hex): the same build, not one built again.
	Image    string `json:"image"`
	Manifest string `json:"manifest"`
	// Size is what the sandbox needs of the target's capacity.
	Size sandbox.Resources `json:"size"`
	// Bytes is what its files take.
	Bytes int64 `json:"bytes"`
}

// Ready is the target's answer to a Check.
type Ready struct {
	// StateDir is where the sandbox's machine lives on the target.
	StateDir string `json:"state_dir"`
}

// Adoption is what the source asks of the target once the store says the
// sandbox is the target's.
type Adoption struct {
	// Resume: it ran (or was paused) on the source; Paused: it was
	// paused. (A hibernated or stopped one stays so.)
	Resume bool `json:"resume"`
	Paused bool `json:"paused"`
}

// Target is the engine of the host a sandbox moves to.
type Target interface {
	// Check says whether this host can take sandbox id.
	Check(ctx context.Context, id string, c Check) (Ready, error)
	// FilesDir is where sandbox id's files go once received whole (its
	// hibernation files; a stopped one's, its machine directory), and
	// IncomingDir where they are written first (on the same file
	// system).
	FilesDir(id string, stopped bool) string
	IncomingDir(id string) string
	// Adopt takes sandbox id up: it is this host's in the store, its
	// files are in FilesDir. (The target may go by what the store says
	// of the move rather than by a.)
	Adopt(ctx context.Context, id string, a Adoption) (*sandbox.Sandbox, error)
	// Drop removes sandbox id's files if the store does not say it is
	// this host's (a move that failed before it was).
	Drop(ctx context.Context, id string) error
	// Receiving says whether this host expects sandbox id's files (the
	// store says they are on their way here).
	Receiving(ctx context.Context, id string) error
	// VolumeIncoming is where the files of volume vol, which moves here
	// with sandbox id, are written first (an error if this host does not
	// expect them); VolumeReceived puts them, written whole, in place.
	VolumeIncoming(ctx context.Context, id, vol string) (string, error)
	VolumeReceived(vol, in string) error
}

// Result is what a move did.
type Result struct {
	Sandbox *sandbox.Sandbox `json:"sandbox"`
	From    string           `json:"from"`
	To      string           `json:"to"`
	// PausedMS is how long the sandbox did not run (from its hibernate on
	// the source to its resume on the target), in milliseconds.
	PausedMS int64 `json:"paused_ms"`
}

// DrainReport is what a drain of a host did.
type DrainReport struct {
	Host   string   `json:"host"`
	Moved  []Moved  `json:"moved"`
	Stayed []Stayed `json:"stayed"`
}

// Moved is a sandbox a drain moved, where, and how long it did not run.
type Moved struct {
	ID       string `json:"id"`
	To       string `json:"to"`
	PausedMS int64  `json:"paused_ms"`
}

// Stayed is a sandbox a drain could not move, and why.
type Stayed struct {
	ID    string `json:"id"`
	Error string `json:"error"`
}

// errorBody is an error on the wire between hosts.
type errorBody struct {
	Code    string `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, err error) {
	code, status := model.CodeInternal, http.StatusInternalServerError
	for _, k := range model.Kinds {
		if errors.Is(err, k.Kind) {
			code, status = k.Code, k.Status
			break
		}
	}
	var se *sandbox.Error
	b := errorBody{Code: code, Message: err.Error()}
	if errors.As(err, &se) {
		b.Field, b.Message = se.Field, se.Msg
	}
	writeJSON(w, status, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// readError turns another host's error answer back into an error of its
// kind (bounded: the body is another host's).
func readError(host string, resp *http.Response) error {
	var b errorBody
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	if json.Unmarshal(raw, &b) != nil || b.Message == "" {
		return sandbox.Errorf(sandbox.ErrUnavailable, "", "host %s answered %s", host, resp.Status)
	}
	for _, k := range model.Kinds {
		if k.Code == b.Code && k.Status == resp.StatusCode {
			return sandbox.Errorf(k.Kind, b.Field, "host %s: %s", host, b.Message)
		}
	}
	return fmt.Errorf("host %s: %s", host, b.Message)
}
