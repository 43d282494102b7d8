package api

import (
	"io"
	"net/http"
	"os"
	"path"
	"strconv"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/sandbox"
)

// pathParam returns the required absolute, clean path query parameter.
func pathParam(r *http.Request) (string, error) { return pathParamNamed(r, "path") }

// pathParamNamed returns the required absolute, clean query parameter name.
func pathParamNamed(r *http.Request, name string) (string, error) {
	p := r.URL.Query().Get(name)
	switch {
	case p == "":
		return "", badRequest(name, "the %s query parameter is required", name)
	case p[0] != '/' || path.Clean(p) != p:
		return "", badRequest(name, "%q must be an absolute, clean path", p)
	case len(p) > 4096:
		return "", badRequest(name, "longer than 4096 bytes")
	}
	return p, nil
}

// modeParam parses an octal mode such as "0644"; empty means 0.
func modeParam(r *http.Request) (uint32, error) {
	v := r.URL.Query().Get("mode")
	if v == "" {
		return 0, nil
	}
	m, err := strconv.ParseUint(v, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, badRequest("mode", "%q is not an octal mode from 0 to 07777", v)
	}
	return uint32(m), nil
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	mode, err := modeParam(r)
	if err != nil {
		return err
	}
	parents, err := boolParam(r.URL.Query().Get("make_parents"), "make_parents")
	if err != nil {
		return err
	}
	// The engine refuses a file past its limit; the body is streamed.
	fi, err := s.eng.WriteFile(r.Context(), r.PathValue("id"), p, s.streamBody(w, r), sandbox.WriteOptions{
		Mode: mode, Owner: r.URL.Query().Get("owner"), MakeParents: parents,
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fi)
	return nil
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	// Spooled to a temporary file, so that an error half way is still a
	// clean JSON error, without holding up to the engine's file limit in
	// memory per request.
	f, err := os.CreateTemp("", "harebox-read-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	n, err := s.eng.ReadFile(r.Context(), r.PathValue("id"), p, f)
	if err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusOK)
	io.Copy(w, f)
	return nil
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	rec, err := boolParam(r.URL.Query().Get("recursive"), "recursive")
	if err != nil {
		return err
	}
	if err := s.eng.RemoveFile(r.Context(), r.PathValue("id"), p, rec); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	fi, err := s.eng.StatFile(r.Context(), r.PathValue("id"), p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fi)
	return nil
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	depth := 0
	if v := r.URL.Query().Get("depth"); v != "" {
		if depth, err = strconv.Atoi(v); err != nil {
			return badRequest("depth", "%q is not a number", v)
		}
	}
	list, truncated, err := s.eng.ListFiles(r.Context(), r.PathValue("id"), p, depth)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": list, "truncated": truncated})
	return nil
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) error {
	p, err := pathParam(r)
	if err != nil {
		return err
	}
	mode, err := modeParam(r)
	if err != nil {
		return err
	}
	fi, err := s.eng.Mkdir(r.Context(), r.PathValue("id"), p, mode, r.URL.Query().Get("owner"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fi)
	return nil
}

func (s *Server) moveFile(w http.ResponseWriter, r *http.Request) error {
	from, err := pathParamNamed(r, "from")
	if err != nil {
		return err
	}
	to, err := pathParamNamed(r, "to")
	if err != nil {
		return err
	}
	fi, err := s.eng.MoveFile(r.Context(), r.PathValue("id"), from, to)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fi)
	return nil
}

func (s *Server) getFirewall(w http.ResponseWriter, r *http.Request) error {
	p, err := s.eng.Firewall(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, p)
	return nil
}

func (s *Server) setFirewall(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(s.jsonBody(w, r))
	if err != nil {
		return err
	}
	p, err := firewall.Parse(body)
	if err != nil {
		return firewall.Invalid(err)
	}
	p, err = s.eng.SetFirewall(r.Context(), r.PathValue("id"), p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, p)
	return nil
}
