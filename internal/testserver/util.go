package testserver

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// JobOutput is what the walkthrough's job (examples/untrusted/job.py)
// prints in the guest.
const JobOutput = "hello from user (uid 1000)"

// Call makes one API request with key and decodes the JSON reply.
func (srv *Server) Call(t testing.TB, method, path, key string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, srv.URL+path, rd)
	req.Header.Set("Authorization", "Bearer "+key)
	client := &http.Client{Timeout: 5 * time.Minute, Transport: srv.HTTP.Transport}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// E2BKey makes an operator key in E2B's form (e2b_ and 96 hex digits,
// what the E2B SDK takes as E2B_API_KEY) and returns its secret.
func (srv *Server) E2BKey(t testing.TB) string {
	t.Helper()
	st, key := srv.Call(t, "POST", "/v1/keys", srv.Key, map[string]any{"format": "e2b"})
	secret, _ := key["secret"].(string)
	if st != 201 || !e2bKey.MatchString(secret) {
		t.Fatalf("an E2B-form key: %d %v", st, key)
	}
	return secret
}

var e2bKey = regexp.MustCompile(`^e2b_[0-9a-f]{96}$`)

// Relaunch starts hareboxd again as srv was started, on the same address
// and data directory, and waits until it answers.
func Relaunch(t testing.TB, srv *Server) {
	t.Helper()
	env := srv.Cmd.Env
	srv.Cmd = exec.Command(srv.Cmd.Path, srv.Cmd.Args[1:]...)
	srv.Cmd.Env = env
	srv.Cmd.Stdout, srv.Cmd.Stderr = srv.Log, srv.Log
	if err := srv.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := srv.HTTP.Get(srv.URL + "/health"); err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("hareboxd did not start again: %s", Tail(srv.Log.String()))
		}
	}
}

// ReadFile is a file's bytes; it fails the test if it cannot read them.
func ReadFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// CopyFile copies a file, readable by its owner only.
func CopyFile(t testing.TB, from, to string) {
	t.Helper()
	if err := os.WriteFile(to, ReadFile(t, from), 0o600); err != nil {
		t.Fatal(err)
	}
}

// EnvCount is a positive number from the environment, or def.
func EnvCount(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}
