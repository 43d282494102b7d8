package apiclient

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/harebox/harebox/sandbox"
)

// RunCode runs a cell in a sandbox's code interpreter and waits for it.
func (c *Client) RunCode(ctx context.Context, id string, req sandbox.CodeRequest) (*sandbox.CodeExecution, error) {
	ctx, cancel := codeDeadline(ctx, &req)
	defer cancel()
	var out sandbox.CodeExecution
	return &out, c.Do(ctx, http.MethodPost, SandboxPath(id, "/code"), nil, req, &out)
}

// RunCodeStream runs a cell and gives emit its output, results and
// exception as they come; it returns the finished cell (its stdout,
// stderr and results empty: emit had them).
func (c *Client) RunCodeStream(ctx context.Context, id string, req sandbox.CodeRequest, emit func(sandbox.CodeEvent) error) (*sandbox.CodeExecution, error) {
	ctx, cancel := codeDeadline(ctx, &req)
	defer cancel()
	resp, err := c.sendWith(ctx, http.MethodPost, SandboxPath(id, "/code"), nil, req, http.Header{"Accept": {"text/event-stream"}})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out *sandbox.CodeExecution
	err = scanSSE(resp.Body, 32<<20, func(event string, data []byte) error {
		ev := sandbox.CodeEvent{Type: event}
		var err error
		switch event {
		case "stdout", "stderr":
			var t struct {
				Text string `json:"text"`
			}
			err = json.Unmarshal(data, &t)
			ev.Text = t.Text
		case "result":
			ev.Result = &sandbox.CodeResult{}
			err = json.Unmarshal(data, ev.Result)
		case "exception":
			ev.Type, ev.Error = "error", &sandbox.CodeError{}
			err = json.Unmarshal(data, ev.Error)
		case "end":
			out = &sandbox.CodeExecution{}
			return json.Unmarshal(data, out)
		default:
			return nil
		}
		if err != nil {
			return err
		}
		return emit(ev)
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		return nil, errors.New("the server's event stream ended before the cell did")
	}
	return out, nil
}

// codeDeadline gives a call with no deadline the cell's timeout and a
// minute.
func codeDeadline(ctx context.Context, req *sandbox.CodeRequest) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, req.Timeout()+time.Minute)
}

// CodeContexts lists a sandbox's code interpreter contexts.
func (c *Client) CodeContexts(ctx context.Context, id string) ([]sandbox.CodeContext, error) {
	var out struct {
		Contexts []sandbox.CodeContext `json:"contexts"`
	}
	return out.Contexts, c.Do(ctx, http.MethodGet, SandboxPath(id, "/code/contexts"), nil, nil, &out)
}

// CreateCodeContext starts a context.
func (c *Client) CreateCodeContext(ctx context.Context, id string, req sandbox.CodeContextRequest) (*sandbox.CodeContext, error) {
	var out sandbox.CodeContext
	return &out, c.Do(ctx, http.MethodPost, SandboxPath(id, "/code/contexts"), nil, req, &out)
}

// RestartCodeContext gives a context a fresh kernel.
func (c *Client) RestartCodeContext(ctx context.Context, id, contextID string) (*sandbox.CodeContext, error) {
	var out sandbox.CodeContext
	return &out, c.Do(ctx, http.MethodPost, SandboxPath(id, "/code/contexts/"+contextID+"/restart"), nil, nil, &out)
}

// DeleteCodeContext shuts a context's kernel down.
func (c *Client) DeleteCodeContext(ctx context.Context, id, contextID string) error {
	return c.Do(ctx, http.MethodDelete, SandboxPath(id, "/code/contexts/"+contextID), nil, nil, nil)
}
