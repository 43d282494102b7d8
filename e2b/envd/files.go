package envd

import (
	"compress/gzip"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
)

// maxParts bounds the files of one multipart upload.
const maxParts = 64

// download answers GET /files: the file's bytes, gzip-compressed when the
// client accepts gzip. A directory or a missing file is an error before
// anything is sent (the engine checks the size, too).
func (s *Server) download(w http.ResponseWriter, r *http.Request, fr fileRequest) error {
	if r.URL.Query().Get("path") == "" {
		return model.Errorf(model.ErrInvalid, "path", "path is required")
	}
	fi, err := s.opts.Files.StatFile(r.Context(), fr.id, fr.path)
	if err != nil {
		return err
	}
	if fi.Type == "dir" {
		return model.Errorf(model.ErrInvalid, "path", "path %q is a directory", fr.path)
	}
	enc, ok := encoding(r.Header.Get("Accept-Encoding"))
	if !ok {
		writeError(w, http.StatusNotAcceptable, "no acceptable encoding found, supported: [identity, gzip]")
		return nil
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(fr.path)}))
	out := &lazyWriter{w: w}
	if enc == "gzip" {
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(out)
		if _, err = s.opts.Files.ReadFile(r.Context(), fr.id, fr.path, gz); err == nil {
			err = gz.Close()
		}
	} else {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
		_, err = s.opts.Files.ReadFile(r.Context(), fr.id, fr.path, out)
	}
	if err != nil && !out.started {
		w.Header().Del("Content-Encoding")
		w.Header().Del("Content-Length")
		w.Header().Del("Content-Disposition")
		return err
	}
	// (An error once bytes went: the connection is cut short, which the
	// client sees as a short body.)
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	return nil
}

// lazyWriter writes the status with its first byte, so an error before
// any is still answered as an error.
type lazyWriter struct {
	w       http.ResponseWriter
	started bool
}

func (l *lazyWriter) Write(b []byte) (int, error) {
	l.started = true
	return l.w.Write(b)
}

// encoding picks the answer's content coding from Accept-Encoding: gzip
// when it is listed, else identity unless refused ("identity;q=0", "*;q=0").
func encoding(accept string) (string, bool) {
	identity := true
	for _, part := range strings.Split(accept, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		refused := strings.ReplaceAll(strings.TrimSpace(params), " ", "") == "q=0"
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "gzip":
			if !refused {
				return "gzip", true
			}
		case "identity", "*":
			if refused {
				identity = false
			}
		}
	}
	return "identity", identity
}

// upload answers POST /files: each file written whole (its parents made),
// owned by the request's user, from a multipart body (its parts named
// "file"; each to the path asked for, or to its own file name) or a raw
// one (to the path asked for), either gzip-compressed if it says so.
func (s *Server) upload(w http.ResponseWriter, r *http.Request, fr fileRequest) error {
	body := io.Reader(r.Body)
	switch strings.ToLower(r.Header.Get("Content-Encoding")) {
	case "", "identity":
	case "gzip":
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			return model.Errorf(model.ErrInvalid, "", "the body is not gzip: %v", err)
		}
		defer gz.Close()
		body = gz
	default:
		return model.Errorf(model.ErrInvalid, "", "content encoding %q is not supported: gzip or identity", r.Header.Get("Content-Encoding"))
	}
	given := r.URL.Query().Get("path")
	var out []entry
	write := func(p string, rd io.Reader) error {
		fi, err := s.opts.Files.WriteFile(r.Context(), fr.id, p, rd, sandbox.WriteOptions{Owner: fr.user, MakeParents: true})
		if err != nil {
			return err
		}
		out = append(out, entry{Path: fi.Path, Name: fi.Name, Type: "file"})
		return nil
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case err == nil && mt == "multipart/form-data":
		mr := multipart.NewReader(body, params["boundary"])
		for n := 0; ; n++ {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return model.Errorf(model.ErrInvalid, "", "a bad multipart body: %v", err)
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			if n >= maxParts {
				return model.Errorf(model.ErrInvalid, "", "at most %d files in one upload", maxParts)
			}
			p := given
			if p == "" {
				p = partPath(part)
			}
			if p == "" {
				return model.Errorf(model.ErrInvalid, "path", "a file without a path")
			}
			err = write(Resolve(p, fr.user), part)
			part.Close()
			if err != nil {
				return err
			}
		}
		if len(out) == 0 {
			return model.Errorf(model.ErrInvalid, "", "no file in the multipart body")
		}
	case err == nil && mt == "application/octet-stream":
		if given == "" {
			return model.Errorf(model.ErrInvalid, "path", "path is required with application/octet-stream")
		}
		if err := write(fr.path, body); err != nil {
			return err
		}
	default:
		return model.Errorf(model.ErrInvalid, "", "content type %q: want multipart/form-data or application/octet-stream", r.Header.Get("Content-Type"))
	}
	w.Header().Set("Content-Type", "application/json")
	return jsonEncode(w, out)
}

// partPath is the file name a part gives, whole: the SDK sends the file's
// path there, and multipart.Part.FileName keeps only its last element.
func partPath(part *multipart.Part) string {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}
