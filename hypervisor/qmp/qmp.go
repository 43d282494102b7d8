// Package qmp is a minimal client of the QEMU Machine Protocol, spoken by
// QEMU itself and by qemu-storage-daemon: one command at a time, each
// bounded by its context, and block-job polling.
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
)

// maxLine bounds one QMP message. QEMU is ours, but a bound keeps a
// confused VMM from making us buffer without limit.
const maxLine = 1 << 20

// maxEventsBeforeGreeting bounds the events Dial skips while it waits for
// the greeting.
const maxEventsBeforeGreeting = 64

// Client is a QMP connection: one command at a time, every call bounded by
// its context. Asynchronous events are read and dropped.
type Client struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
}

// Error is an error QMP returned for a command.
type Error struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *Error) Error() string { return "qmp: " + e.Class + ": " + e.Desc }

type reply struct {
	Return json.RawMessage `json:"return"`
	Error  *Error          `json:"error"`
	Event  string          `json:"event"`
	QMP    json.RawMessage `json:"QMP"`
}

// Dial connects to a QMP socket and negotiates capabilities.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial %s: %w", path, err)
	}
	q := &Client{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	if err := q.withDeadline(ctx, func() error {
		// An event can come before the greeting: the socket serves one
		// client at a time, and QEMU may still send the previous
		// client's session an event (a block job's) as it hands over to
		// this one. Events are skipped, a bounded number of them.
		for range maxEventsBeforeGreeting {
			var greet reply
			if err := q.read(&greet); err != nil {
				return err
			}
			if greet.QMP != nil {
				return nil
			}
			if greet.Event == "" {
				return fmt.Errorf("qmp: no greeting: %+v", greet)
			}
		}
		return fmt.Errorf("qmp: no greeting after %d events", maxEventsBeforeGreeting)
	}); err != nil {
		conn.Close()
		return nil, err
	}
	if _, err := q.Execute(ctx, "qmp_capabilities", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

func (q *Client) Close() error { return q.conn.Close() }

// Run runs one command on a connection of its own. QEMU and the storage
// daemon serve one QMP client at a time, so a held connection would lock
// out every other user; and a command that timed out leaves its answer
// unread on its connection, which is then closed with it.
func Run(ctx context.Context, path, cmd string, args any) (json.RawMessage, error) {
	q, err := Dial(ctx, path)
	if err != nil {
		return nil, err
	}
	defer q.Close()
	return q.Execute(ctx, cmd, args)
}

// Execute runs one command and returns its "return" value.
func (q *Client) Execute(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var out json.RawMessage
	err = q.withDeadline(ctx, func() error {
		if _, err := q.conn.Write(append(b, '\n')); err != nil {
			return fmt.Errorf("qmp: write %s: %w", cmd, err)
		}
		for {
			var rep reply
			if err := q.read(&rep); err != nil {
				return fmt.Errorf("qmp: %s: %w", cmd, err)
			}
			switch {
			case rep.Event != "":
				continue
			case rep.Error != nil:
				return rep.Error
			default:
				out = rep.Return
				return nil
			}
		}
	})
	return out, err
}

func (q *Client) withDeadline(ctx context.Context, f func() error) error {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(30 * time.Second)
	}
	q.conn.SetDeadline(dl)
	defer q.conn.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { q.conn.SetDeadline(time.Now()) })
	defer stop()
	err := f()
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	// The socket deadline can fire just before the context notices.
	if _, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
	}
	return err
}

func (q *Client) read(v *reply) error {
	var line []byte
	for {
		chunk, isPrefix, err := q.r.ReadLine()
		if err != nil {
			return err
		}
		line = append(line, chunk...)
		if len(line) > maxLine {
			return errors.New("qmp: message too long")
		}
		if !isPrefix {
			break
		}
	}
	return json.Unmarshal(line, v)
}

// Exec runs one QMP command.
type Exec func(ctx context.Context, cmd string, args any) (json.RawMessage, error)

// ErrNoJob: WaitJob's job is not (or no longer) there.
var ErrNoJob = errors.New("qmp: no such job")

// WaitJob polls a block job started with auto-dismiss off until it
// concludes, dismisses it and returns its error.
func WaitJob(ctx context.Context, exec Exec, id string) error {
	for {
		out, err := exec(ctx, "query-jobs", nil)
		if err != nil {
			return err
		}
		var jobs []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		if err := json.Unmarshal(out, &jobs); err != nil {
			return fmt.Errorf("qmp: query-jobs: %w", err)
		}
		found := false
		for _, j := range jobs {
			if j.ID != id {
				continue
			}
			found = true
			if j.Status == "concluded" {
				// (A job left undismissed keeps its ID taken.)
				if _, err := exec(ctx, "job-dismiss", map[string]any{"id": id}); err != nil {
					return fmt.Errorf("qmp: job %s: %w", id, err)
				}
				if j.Error != "" {
					return fmt.Errorf("qmp: job %s: %s", id, j.Error)
				}
				return nil
			}
		}
		if !found {
			return fmt.Errorf("%w: %s", ErrNoJob, id)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// CopyTop copies what the block node device holds in its top layer
// (blockdev-backup, sync top) into dst, an encrypted qcow2 made for it
// over the same backing file, opened with passphrase: a LUKS secret that
// reaches the process for this copy only. It removes the job, the target
// node and the secret again, also after a failure (bounded, whatever ctx
// has left), and reports what it could not remove. tag names them (one
// copy per tag at a time). exec should dial a connection per command: a
// command that timed out leaves its answer unread on its connection.
func CopyTop(ctx context.Context, exec Exec, device, dst, passphrase, tag string) (err error) {
	secret, node, job := "sec-"+tag, tag, "job-"+tag
	started := false
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		var errs []error
		if started && err != nil {
			exec(cctx, "job-cancel", map[string]any{"id": job})
			if werr := WaitJob(cctx, exec, job); werr != nil && !errors.Is(werr, ErrNoJob) {
				errs = append(errs, werr)
			}
		}
		// (Removing what was never added is harmless.)
		if _, derr := exec(cctx, "blockdev-del", map[string]any{"node-name": node}); derr != nil && !IsNotFound(derr) {
			errs = append(errs, derr)
		}
		if _, derr := exec(cctx, "object-del", map[string]any{"id": secret}); derr != nil && !IsNotFound(derr) {
			errs = append(errs, derr)
		}
		if len(errs) > 0 {
			err = errors.Join(err, fmt.Errorf("qmp: clean up after the copy: %w", errors.Join(errs...)))
		}
	}()
	if _, err := exec(ctx, "object-add", map[string]any{"qom-type": "secret", "id": secret, "data": passphrase, "format": "raw"}); err != nil {
		return err
	}
	if _, err := exec(ctx, "blockdev-add", map[string]any{
		"driver": "qcow2", "node-name": node,
		"file":    map[string]any{"driver": "file", "filename": dst},
		"encrypt": map[string]any{"format": "luks", "key-secret": secret},
	}); err != nil {
		return err
	}
	started = true // (if the command timed out, it may have)
	if _, err := exec(ctx, "blockdev-backup", map[string]any{
		"job-id": job, "device": device, "target": node, "sync": "top", "auto-dismiss": false,
	}); err != nil {
		return err
	}
	return WaitJob(ctx, exec, job)
}

// Stream copies into the block node device what it reads from the
// layers below it down to base (a backing file's name, kept as the new
// backing file; empty: every layer), then drops those layers
// (block-stream, while the guest runs). job names the job; a stream that
// fails is cancelled and dismissed, so the name is free again.
func Stream(ctx context.Context, exec Exec, device, base, job string) (err error) {
	args := map[string]any{"job-id": job, "device": device, "auto-dismiss": false}
	if base != "" {
		args["base"] = base
	}
	if _, err := exec(ctx, "block-stream", args); err != nil {
		return err
	}
	defer func() {
		if err != nil && !errors.Is(err, ErrNoJob) {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			exec(cctx, "job-cancel", map[string]any{"id": job})
			WaitJob(cctx, exec, job)
		}
	}()
	return WaitJob(ctx, exec, job)
}

// IsNotFound: QMP's answer for a node or object that is not there.
func IsNotFound(err error) bool {
	var qe *Error
	return errors.As(err, &qe) && (qe.Class == "DeviceNotFound" || strings.Contains(qe.Desc, "not found") || strings.Contains(qe.Desc, "find node"))
}
