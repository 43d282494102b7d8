// Package testpg runs a real PostgreSQL server for tests: Debian's
// binaries, a cluster in a temporary directory, reached on a Unix socket
// only (no TCP port), torn down by Stop. As root it runs as the
// "postgres" user (PostgreSQL refuses root).
package testpg

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// Server is a running PostgreSQL cluster.
type Server struct {
	dir, bin string
	cred     *syscall.Credential
	admin    *sql.DB
	next     atomic.Int64
}

// ErrMissing is returned when PostgreSQL is not installed.
var ErrMissing = errors.New("testpg: PostgreSQL is not installed (make deps installs it: apt-get install postgresql)")

// binDir finds the newest installed server's binaries.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(dirs) == 0 {
		return "", ErrMissing
	}
	sort.Slice(dirs, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(dirs[i]))))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(dirs[j]))))
		return a < b
	})
	return filepath.Dir(dirs[len(dirs)-1]), nil
}

// Start makes a cluster in a new temporary directory and starts it.
func Start() (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	reapStale(bin)
	dir, err := os.MkdirTemp("", "hbpg")
	if err != nil {
		return nil, err
	}
	// The test process that owns it: a later Start stops a server whose
	// owner is gone (killed by a timeout before it could).
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &Server{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("testpg: as root, the server runs as the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := s.run("initdb", "-D", s.data(), "-U", "harebox", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C.UTF-8"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// No TCP listener; the socket in the directory; no durability to
	// pay for (tests).
	opts := "-c listen_addresses='' -k " + dir + " -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
	if err := s.run("pg_ctl", "-D", s.data(), "-l", filepath.Join(dir, "log"), "-o", opts, "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%w\n%s", err, log)
	}
	s.admin, err = sql.Open("pgx", s.dsn("postgres"))
	if err == nil {
		err = s.admin.Ping()
	}
	if err != nil {
		s.Stop()
		return nil, fmt.Errorf("testpg: connect: %w", err)
	}
	return s, nil
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// reapStale stops the servers (and removes the directories) that Start
// made for test processes that are gone.
func reapStale(bin string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "hbpg*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			continue // (not one of ours, or being made)
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		st, err := os.Stat(dir)
		if err != nil {
			continue
		}
		s := &Server{dir: dir, bin: bin}
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 && sys.Uid != 0 {
			s.cred = &syscall.Credential{Uid: sys.Uid, Gid: sys.Gid}
		}
		s.Stop()
	}
}

// dsn is a database's URL: the cluster's socket directory as its host.
func (s *Server) dsn(db string) string {
	return "postgres://harebox@/" + db + "?host=" + url.QueryEscape(s.dir) + "&sslmode=disable"
}

func (s *Server) run(name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("testpg: %s: %w\n%s", name, err, out.String())
	}
	return nil
}

// NewDatabase creates an empty database and returns its URL
// (postgres://harebox@/NAME?host=SOCKET_DIR).
func (s *Server) NewDatabase() (string, error) {
	name := fmt.Sprintf("t%d_%d", os.Getpid(), s.next.Add(1))
	if _, err := s.admin.Exec("CREATE DATABASE " + name); err != nil {
		return "", fmt.Errorf("testpg: %w", err)
	}
	return s.dsn(name), nil
}

// Database returns a new database of s, a server its test package
// started once (err is what Start returned): it skips tb where PostgreSQL
// is not installed and fails it on any other error.
func Database(tb testing.TB, s *Server, err error) string {
	tb.Helper()
	if errors.Is(err, ErrMissing) {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	dsn, err := s.NewDatabase()
	if err != nil {
		tb.Fatal(err)
	}
	return dsn
}

// ForTest starts a server for one test or benchmark, stopped when it
// ends, and returns a new database of it, as Database would.
func ForTest(tb testing.TB) string {
	tb.Helper()
	s, err := Start()
	if s != nil {
		tb.Cleanup(func() { s.Stop() })
	}
	return Database(tb, s, err)
}

// Stop stops the server (fast: its connections are ended) and removes
// its directory.
func (s *Server) Stop() error {
	if s.admin != nil {
		s.admin.Close()
	}
	err := s.run("pg_ctl", "-D", s.data(), "-m", "immediate", "-w", "stop")
	return errors.Join(err, os.RemoveAll(s.dir))
}
