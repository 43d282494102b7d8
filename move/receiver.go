package move

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/internal/fsync"
	"github.com/harebox/harebox/sandbox"
)

// Receiver serves a target host's side of moves (under Prefix). Mount it
// on the internal endpoint only (cluster.Internal): the caller is another
// host of the deployment.
type Receiver struct {
	t Target
	// Idle cuts a files' stream that sends nothing for that long.
	Idle time.Duration
}

// NewReceiver returns the receiver of target t.
func NewReceiver(t Target) *Receiver { return &Receiver{t: t, Idle: 30 * time.Second} }

// maxBody bounds the JSON bodies of a move's calls.
const maxBody = 16 << 10

func (rv *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, what, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, Prefix), "/")
	if !sandbox.ValidID(id) {
		writeError(w, sandbox.Errorf(sandbox.ErrNotFound, "", "no sandbox %q", id))
		return
	}
	ctx := r.Context()
	switch {
	case r.Method == http.MethodPost && what == "check":
		var c Check
		if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&c); err != nil {
			writeError(w, sandbox.Errorf(sandbox.ErrInvalid, "", "a move's check: %v", err))
			return
		}
		ready, err := rv.t.Check(ctx, id, c)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, ready)
	case r.Method == http.MethodPut && what == "files":
		if err := rv.receive(w, r, id); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPut && strings.HasPrefix(what, "volumes/"):
		if err := rv.receiveVolume(w, r, id, strings.TrimPrefix(what, "volumes/")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPost && what == "adopt":
		var a Adoption
		if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&a); err != nil {
			writeError(w, sandbox.Errorf(sandbox.ErrInvalid, "", "a move's adoption: %v", err))
			return
		}
		sb, err := rv.t.Adopt(ctx, id, a)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, sb)
	case r.Method == http.MethodDelete && what == "":
		if err := rv.t.Drop(ctx, id); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		writeError(w, sandbox.Errorf(sandbox.ErrNotFound, "", "no such call of a move: %s %s", r.Method, r.URL.Path))
	}
}

// receiveVolume writes the stream of volume vol's files into its
// incoming directory, then has the target put them in place.
func (rv *Receiver) receiveVolume(w http.ResponseWriter, r *http.Request, id, vol string) error {
	max, err := announced(r)
	if err != nil {
		return err
	}
	if !fileName.MatchString(vol) {
		return sandbox.Errorf(sandbox.ErrNotFound, "", "no volume %q", vol)
	}
	in, err := rv.t.VolumeIncoming(r.Context(), id, vol)
	if err != nil {
		return err
	}
	if err := rv.unpack(w, r, in, max); err != nil {
		return err
	}
	return rv.t.VolumeReceived(vol, in)
}

// announced is the size in bytes a stream of files says it carries.
func announced(r *http.Request) (int64, error) {
	max, err := strconv.ParseInt(r.URL.Query().Get("bytes"), 10, 64)
	if err != nil || max < 0 {
		return 0, sandbox.Errorf(sandbox.ErrInvalid, "bytes", "a move's files need their size in bytes")
	}
	return max, nil
}

// unpack writes the request's stream of files (max bytes) into dir, made
// anew, with room for them checked first; on an error nothing stays.
func (rv *Receiver) unpack(w http.ResponseWriter, r *http.Request, dir string, max int64) error {
	os.RemoveAll(dir) // (what a move cut short left)
	var fs unix.Statfs_t
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	if unix.Statfs(filepath.Dir(dir), &fs) == nil && uint64(max) > fs.Bavail*uint64(fs.Bsize) {
		return sandbox.Errorf(sandbox.ErrCapacity, "", "this host's disk has no room for the move's %d bytes", max)
	}
	body := &idleReader{r: r.Body, rc: http.NewResponseController(w), idle: rv.Idle}
	if err := unpack(body, dir, max); err != nil {
		os.RemoveAll(dir)
		return err
	}
	return nil
}

// receive writes the files' stream into the incoming directory, then
// moves it whole to where the sandbox's files go.
func (rv *Receiver) receive(w http.ResponseWriter, r *http.Request, id string) error {
	max, err := announced(r)
	if err != nil {
		return err
	}
	if err := rv.t.Receiving(r.Context(), id); err != nil {
		return err
	}
	in, dst := rv.t.IncomingDir(id), rv.t.FilesDir(id, r.URL.Query().Get("stopped") == "1")
	if _, err := os.Stat(dst); err == nil {
		// (What an earlier move of it that failed left: not this host's.)
		if err := rv.t.Drop(r.Context(), id); err != nil {
			return err
		}
	}
	if err := rv.unpack(w, r, in, max); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		os.RemoveAll(in)
		return err
	}
	if err := os.Rename(in, dst); err != nil {
		os.RemoveAll(in)
		return err
	}
	// The rename on disk before the answer: once the sender has it, it
	// deletes its own copy.
	for _, d := range []string{filepath.Dir(dst), filepath.Dir(in)} {
		if err := fsync.Dir(d); err != nil {
			return fmt.Errorf("move: %w", err)
		}
	}
	return nil
}

// idleReader pushes the connection's read deadline on before each read:
// a sender that stalls for idle is cut, one that sends is not.
type idleReader struct {
	r    io.Reader
	rc   *http.ResponseController
	idle time.Duration
}

func (ir *idleReader) Read(p []byte) (int, error) {
	ir.rc.SetReadDeadline(time.Now().Add(ir.idle))
	return ir.r.Read(p)
}
