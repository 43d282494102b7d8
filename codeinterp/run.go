package codeinterp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"image"
	_ "image/jpeg" // (DecodeConfig of a cell's JPEG results)
	_ "image/png"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/harebox/harebox/sandbox"
)

// Run runs a cell and returns how it ended. env (the sandbox's variables
// under the request's) is what the cell sees. Each stdout and stderr
// chunk, result and error is given to emit as it comes, if emit is set;
// an error from emit stops the run (the interpreter interrupts the cell
// when its caller hangs up).
func (c *Client) Run(ctx context.Context, r sandbox.CodeRequest, env map[string]string, emit func(sandbox.CodeEvent) error) (*sandbox.CodeExecution, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.Timeout()+c.o.Grace)
	defer cancel()
	body := struct {
		Code      string            `json:"code"`
		ContextID string            `json:"context_id,omitempty"`
		Language  string            `json:"language,omitempty"`
		Env       map[string]string `json:"env,omitempty"`
		Timeout   float64           `json:"timeout_seconds"`
	}{r.Code, r.ContextID, r.Language, env, r.Timeout().Seconds()}
	resp, err := c.call(ctx, http.MethodPost, "/execute", body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	x := &execution{c: c, emit: emit, out: sandbox.CodeExecution{ContextID: r.ContextID, Results: []sandbox.CodeResult{}}}
	if x.out.ContextID == "" {
		x.out.ContextID = sandbox.DefaultCodeContext(r.Language)
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	if err := x.read(br); err != nil {
		if ctx.Err() != nil && !errors.Is(err, errEmit) {
			return nil, sandbox.Errorf(sandbox.ErrTimeout, "", "the code interpreter did not end the cell within %s of its timeout", c.o.Grace)
		}
		return nil, err
	}
	x.out.DurationMS = time.Since(start).Milliseconds()
	drain(br, cancel)
	return &x.out, nil
}

// drain reads the rest of an answer after its end line (the body's last
// chunk): an answer read to its end leaves its connection to the next
// call, where one closed early takes it down, and each call would dial
// the guest anew through the agent. A guest that stalls there is cut
// after a second (cancel).
func drain(r io.Reader, cancel context.CancelFunc) {
	t := time.AfterFunc(time.Second, cancel)
	defer t.Stop()
	io.Copy(io.Discard, io.LimitReader(r, 4<<10))
}

// errEmit marks emit's error.
var errEmit = errors.New("the caller stopped reading")

// execution is one cell's answer being read.
type execution struct {
	c    *Client
	emit func(sandbox.CodeEvent) error
	out  sandbox.CodeExecution
	// streamed counts what was forwarded of stdout and stderr; kept what
	// the results hold.
	streamed [2]int
	kept     int
	stdout   strings.Builder
	stderr   strings.Builder
}

// event is one line of the interpreter's answer.
type event struct {
	Type      string                     `json:"type"`
	Text      *string                    `json:"text"`
	Main      *bool                      `json:"main"`
	Data      map[string]json.RawMessage `json:"data"`
	Metadata  json.RawMessage            `json:"metadata"`
	Name      *string                    `json:"name"`
	Value     *string                    `json:"value"`
	Traceback *string                    `json:"traceback"`
	Count     *int64                     `json:"count"`
	Status    string                     `json:"status"`
}

// read reads the answer's lines up to its end line.
func (x *execution) read(br *bufio.Reader) error {
	for {
		line, err := readLine(br)
		if errors.Is(err, io.EOF) {
			return lie("the answer ended before the cell did")
		}
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var ev event
		d := json.NewDecoder(bytes.NewReader(line))
		d.DisallowUnknownFields()
		if err := d.Decode(&ev); err != nil {
			return lie("a line that is not an event: %v", err)
		}
		done, err := x.handle(&ev)
		if err != nil || done {
			x.out.Stdout, x.out.Stderr = x.stdout.String(), x.stderr.String()
			return err
		}
	}
}

// readLine reads one line of at most MaxLine bytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > MaxLine {
			return nil, lie("a line longer than %d bytes", MaxLine)
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return nil, lie("the answer ended in the middle of a line")
		default:
			return nil, err
		}
	}
}

// handle takes one event; done once the cell ended.
func (x *execution) handle(ev *event) (done bool, err error) {
	switch ev.Type {
	case "stdout", "stderr":
		if ev.Text == nil {
			return false, lie("a %s event without text", ev.Type)
		}
		return false, x.output(ev.Type, *ev.Text)
	case "result":
		if ev.Main == nil || ev.Data == nil {
			return false, lie("a result without main or data")
		}
		res, err := x.result(*ev.Main, ev.Data)
		if err != nil || res == nil {
			return false, err
		}
		return false, x.send(sandbox.CodeEvent{Type: "result", Result: res})
	case "error":
		if ev.Name == nil || ev.Value == nil {
			return false, lie("an error without name or value")
		}
		ce := &sandbox.CodeError{Name: clean(*ev.Name, MaxErrorName), Value: clean(*ev.Value, MaxErrorValue)}
		if ev.Traceback != nil {
			ce.Traceback = clean(*ev.Traceback, MaxTraceback)
		}
		x.out.Error = ce
		return false, x.send(sandbox.CodeEvent{Type: "error", Error: ce})
	case "count":
		if ev.Count == nil || *ev.Count < 0 || *ev.Count > 1<<31 {
			return false, lie("a bad execution count")
		}
		x.out.ExecutionCount = int(*ev.Count)
		return false, nil
	case "end":
		switch ev.Status {
		case sandbox.CodeOK, sandbox.CodeFailed, sandbox.CodeTimeout, sandbox.CodeDied:
		default:
			return false, lie("a cell that ended %q", clean(ev.Status, 40))
		}
		if ev.Status != sandbox.CodeOK && x.out.Error == nil {
			return false, lie("a cell that ended %q without an error", ev.Status)
		}
		x.out.Status = ev.Status
		return true, nil
	default:
		return false, lie("an event of type %q", clean(ev.Type, 40))
	}
}

// output forwards a chunk up to MaxStream per stream, and keeps it up to
// MaxOutput.
func (x *execution) output(stream, text string) error {
	i, b, trunc := 0, &x.stdout, &x.out.StdoutTruncated
	if stream == "stderr" {
		i, b, trunc = 1, &x.stderr, &x.out.StderrTruncated
	}
	text = strings.ToValidUTF8(text, "\uFFFD")
	if room := x.c.o.MaxOutput - b.Len(); room < len(text) {
		b.WriteString(cut(text, max(room, 0)))
		*trunc = true
	} else {
		b.WriteString(text)
	}
	room := x.c.o.MaxStream - x.streamed[i]
	if room <= 0 {
		*trunc = true
		return nil
	}
	if room < len(text) {
		text, *trunc = cut(text, room), true
	}
	x.streamed[i] += len(text)
	return x.send(sandbox.CodeEvent{Type: stream, Text: text})
}

func (x *execution) send(ev sandbox.CodeEvent) error {
	if x.emit == nil {
		return nil
	}
	if err := x.emit(ev); err != nil {
		return errors.Join(errEmit, err)
	}
	return nil
}

// result checks one MIME bundle and keeps what it may; nil if nothing
// (counted as dropped).
func (x *execution) result(main bool, data map[string]json.RawMessage) (*sandbox.CodeResult, error) {
	if len(x.out.Results) >= MaxResults {
		x.out.ResultsDropped++
		return nil, nil
	}
	res := sandbox.CodeResult{IsMainResult: main}
	size, kept := 0, 0
	for mime, raw := range data {
		if mime == ChartMIME {
			c, err := checkChart(raw)
			if err != nil {
				return nil, err
			}
			res.Chart, size, kept = c, size+len(c), kept+1
			continue
		}
		if mime == "application/json" {
			if len(raw) > MaxResultBytes || !json.Valid(raw) {
				return nil, lie("an application/json result that is not JSON or too large")
			}
			var buf bytes.Buffer
			json.Compact(&buf, raw)
			res.JSON, size, kept = buf.Bytes(), size+buf.Len(), kept+1
			continue
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, lie("a %s result that is not a string", clean(mime, 80))
		}
		if len(s) > MaxResultBytes*4/3+1024 {
			return nil, lie("a %s result of %d bytes", clean(mime, 80), len(s))
		}
		var dst *string
		switch mime {
		case "text/plain":
			dst = &res.Text
		case "text/html":
			dst = &res.HTML
		case "text/markdown":
			dst = &res.Markdown
		case "image/svg+xml":
			dst = &res.SVG
		case "text/latex":
			dst = &res.LaTeX
		case "image/png", "image/jpeg":
			b64, w, h, err := checkImage(mime, s)
			if err != nil {
				return nil, err
			}
			if mime == "image/png" {
				res.PNG, res.Width, res.Height = b64, w, h
			} else {
				res.JPEG = b64
				if res.PNG == "" {
					res.Width, res.Height = w, h
				}
			}
			size, kept = size+len(b64), kept+1
			continue
		default:
			continue // (a format not kept)
		}
		if len(s) > MaxResultBytes {
			return nil, lie("a %s result of %d bytes", mime, len(s))
		}
		*dst, size, kept = strings.ToValidUTF8(s, "\uFFFD"), size+len(s), kept+1
	}
	if kept == 0 || x.kept+size > MaxResultsBytes {
		x.out.ResultsDropped++
		return nil, nil
	}
	// (A PNG seen after a JPEG gives the size.)
	x.kept += size
	x.out.Results = append(x.out.Results, res)
	return &x.out.Results[len(x.out.Results)-1], nil
}

// checkImage decodes an image result's base64 and its header: a PNG or
// JPEG as its type says, of sane dimensions. It returns the base64 in
// canonical form.
func checkImage(mime, s string) (string, int, int, error) {
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == ' ' || r == '\t' {
			return -1
		}
		return r
	}, s)
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) > MaxResultBytes {
		return "", 0, 0, lie("a %s result that is not base64 of at most %d bytes", mime, MaxResultBytes)
	}
	cfg, format, err := image.DecodeConfig(bytes.NewReader(raw))
	if err != nil || "image/"+format != mime {
		return "", 0, 0, lie("a %s result that is not one", mime)
	}
	if cfg.Width <= 0 || cfg.Height <= 0 || cfg.Width > MaxImageSide || cfg.Height > MaxImageSide || cfg.Width*cfg.Height > MaxImagePixels {
		return "", 0, 0, lie("a %s result of %dx%d pixels", mime, cfg.Width, cfg.Height)
	}
	return base64.StdEncoding.EncodeToString(raw), cfg.Width, cfg.Height, nil
}

// clean makes s valid UTF-8 of at most n bytes.
func clean(s string, n int) string {
	return cut(strings.ToValidUTF8(s, "\uFFFD"), n)
}

// cut cuts s to at most n bytes, at a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
