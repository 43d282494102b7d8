package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// qmpMaxLine bounds one QMP message. QEMU is ours, but a bound keeps a
// confused VMM from making us buffer without limit.
const qmpMaxLine = 1 << 20

// qmp is a minimal QMP client: one command at a time, every call bounded by
// its context. Asynchronous events are read and dropped.
type qmp struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
}

type qmpError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *qmpError) Error() string { return "qmp: " + e.Class + ": " + e.Desc }

type qmpReply struct {
	Return json.RawMessage `json:"return"`
	Error  *qmpError       `json:"error"`
	Event  string          `json:"event"`
	QMP    json.RawMessage `json:"QMP"`
}

// dialQMP connects to a QMP socket and negotiates capabilities.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial %s: %w", path, err)
	}
	q := &qmp{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	if err := q.withDeadline(ctx, func() error {
		var greet qmpReply
		if err := q.read(&greet); err != nil {
			return err
		}
		if greet.QMP == nil {
			return errors.New("qmp: no greeting")
		}
		return nil
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

func (q *qmp) Close() error { return q.conn.Close() }

// Execute runs one command and returns its "return" value.
func (q *qmp) Execute(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
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
			var rep qmpReply
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

func (q *qmp) withDeadline(ctx context.Context, f func() error) error {
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

func (q *qmp) read(v *qmpReply) error {
	var line []byte
	for {
		chunk, isPrefix, err := q.r.ReadLine()
		if err != nil {
			return err
		}
		line = append(line, chunk...)
		if len(line) > qmpMaxLine {
			return errors.New("qmp: message too long")
		}
		if !isPrefix {
			break
		}
	}
	return json.Unmarshal(line, v)
}
